// Package responder is the floor's workload for `cube bench`: a tiny
// program started in fresh namespaces that listens like envd and answers on
// a socket. It imports almost nothing so its static binary stays small.
package responder

import (
	"fmt"
	"net"
	"os"
)

// Main is the body of the floor's static responder: it listens on
// TCP :49983 in its (new, empty) network namespace as envd would, then
// answers each byte read on fd 3 with '!' until fd 3 reaches EOF.
func Main() int {
	ln, err := net.Listen("tcp", ":49983")
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchfloor:", err)
		return 1
	}
	defer ln.Close()
	sock := os.NewFile(3, "bench")
	if sock == nil {
		fmt.Fprintln(os.Stderr, "benchfloor: no socket on fd 3 (this is started by `cube bench`)")
		return 2
	}
	var b [1]byte
	for {
		if _, err := sock.Read(b[:]); err != nil {
			return 0
		}
		if _, err := sock.Write([]byte{'!'}); err != nil {
			return 0
		}
	}
}

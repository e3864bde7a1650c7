// Command cube-shim is the small binary Cube starts once per sandbox to
// build it: `cube-shim shim` makes the sandbox (namespaces, mounts, cgroup)
// and then execs the process that lives as long as the sandbox, its
// supervisor (cube-supervisor next to it, else this binary's `supervise`
// subcommand; see package supervisor); `cube-shim sandbox-init` is the code
// that runs inside the new sandbox's namespaces. It holds only the namespace
// runtime, so it starts fast; the full `cube` binary serves the same
// subcommands when cube-shim is not installed next to it.
package main

import (
	"fmt"
	"os"

	"github.com/cube-dev/cube/internal/nsrt"
)

func main() {
	if code, ok := nsrt.Dispatch(os.Args[1:]); ok {
		os.Exit(code)
	}
	fmt.Fprintln(os.Stderr, "cube-shim is started by cubelet (subcommands: shim, sandbox-init, supervise); it is not for direct use")
	os.Exit(2)
}

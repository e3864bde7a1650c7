// Command cube-reaper is pid 1 of a sandbox: it starts envd (or, in a user
// namespace, adopts the envd the runtime started), reaps every orphan the
// kernel hands it and exits with envd's status. It catches no signal: a
// termination signal ends it, and with it the sandbox's pid namespace. It is
// a separate small binary so pid 1 costs a fraction of envd's memory (envd
// can still reap for itself when it is pid 1, for runtimes that start it
// directly).
//
//	cube-reaper [--inherit-fd N] -- ARGV...   start ARGV (passing fd N on) and reap
//	CUBE_REAP_PID=PID cube-reaper            reap until PID exits
package main

import (
	"os"
	"strconv"

	"github.com/cube-dev/cube/internal/envd/reaper"
)

func main() {
	if pid, ok := reaper.Adopted(); ok {
		code, err := reaper.Adopt(pid)
		if err != nil {
			os.Stderr.WriteString("cube-reaper: " + err.Error() + "\n")
		}
		os.Exit(code)
	}
	argv, inheritFD, ok := parse(os.Args[1:])
	if !ok {
		os.Stderr.WriteString("usage: cube-reaper [--inherit-fd N] -- ARGV... (or CUBE_REAP_PID=PID cube-reaper)\n")
		os.Exit(2)
	}
	code, err := reaper.Start(argv, inheritFD)
	if err != nil {
		os.Stderr.WriteString("cube-reaper: " + err.Error() + "\n")
	}
	os.Exit(code)
}

// parse reads [--inherit-fd N] -- ARGV...
func parse(args []string) (argv []string, inheritFD int, ok bool) {
	for len(args) > 0 {
		switch args[0] {
		case "--":
			return args[1:], inheritFD, len(args) > 1
		case "--inherit-fd":
			if len(args) < 2 {
				return nil, 0, false
			}
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 3 {
				return nil, 0, false
			}
			inheritFD, args = n, args[2:]
		default:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

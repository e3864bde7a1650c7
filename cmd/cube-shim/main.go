// Command cube-shim is the small binary Cube runs once per sandbox: the
// per-sandbox supervisor (`cube-shim shim`) and the code that runs inside a
// new sandbox's namespaces (`cube-shim sandbox-init`). It holds only the
// namespace runtime, so it starts fast and stays small in memory for the
// sandbox's whole life; the full `cube` binary serves the same subcommands
// when cube-shim is not installed next to it.
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
	fmt.Fprintln(os.Stderr, "cube-shim is started by cubelet (subcommands: shim, sandbox-init); it is not for direct use")
	os.Exit(2)
}

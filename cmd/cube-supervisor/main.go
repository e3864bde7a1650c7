// Command cube-supervisor is the part of a sandbox's shim that lives as
// long as the sandbox (see package supervisor). The shim execs it once the
// sandbox is ready; it is kept apart from cube-shim so that the process
// every sandbox pays for holds only what supervising needs.
package main

import (
	"os"

	"github.com/cube-dev/cube/internal/supervisor"
)

func main() {
	os.Exit(supervisor.Main(os.Args[1:]))
}

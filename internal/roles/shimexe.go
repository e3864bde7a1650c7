package roles

import "github.com/cube-dev/cube/internal/exepath"

// ShimBinary is the binary started once per sandbox (shim, sandbox-init):
// cube-shim next to the cube binary when installed (small, fast to start),
// else the cube binary itself, which serves the same subcommands.
func ShimBinary(cubeExe string) string {
	if p, ok := exepath.Sibling(cubeExe, "cube-shim"); ok {
		return p
	}
	return cubeExe
}

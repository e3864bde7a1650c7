package app

import (
	"os"
	"path/filepath"
)

// ShimBinary is the binary started once per sandbox (shim, sandbox-init):
// cube-shim next to the cube binary when installed (small, fast to start),
// else the cube binary itself, which serves the same subcommands.
func ShimBinary(cubeExe string) string {
	p := filepath.Join(filepath.Dir(cubeExe), "cube-shim")
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return p
	}
	return cubeExe
}

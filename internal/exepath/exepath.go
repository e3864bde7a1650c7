// Package exepath finds Cube's helper binaries, which are installed next to
// the binary that starts them (cube-shim next to cube, cube-supervisor next
// to cube-shim, cube-reaper next to envd).
package exepath

import (
	"os"
	"path/filepath"
)

// Executable reports whether path is a regular file with an execute bit.
func Executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// Sibling returns the path of name in file's directory, and whether an
// executable is there.
func Sibling(file, name string) (string, bool) {
	p := filepath.Join(filepath.Dir(file), name)
	return p, Executable(p)
}

// Package deptest keeps heavy packages out of a binary's import graph:
// binaries started per sandbox (cube-shim three times per create, the
// supervisor and envd once, each living as long as the sandbox) pay for every
// package they link in start-up CPU, page faults and memory.
package deptest

import (
	"os/exec"
	"strings"
	"testing"
)

// Forbid fails t when pkg (an import path, or "." for the test's own
// package) depends on any of banned: import paths, or patterns ending in
// "/..." for a package and everything under it, as the go command reads
// them ("github.com/cilium/ebpf/..." also bans ".../ebpf/asm").
func Forbid(t testing.TB, pkg string, banned ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if matches(b, dep) {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

func matches(pattern, pkg string) bool {
	if root, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == root || strings.HasPrefix(pkg, root+"/")
	}
	return pkg == pattern
}

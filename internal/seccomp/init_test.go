package seccomp

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
)

// TestInitStaysSmall: cube-shim links this package and starts three times
// per create, so its package init runs each time. The syscall-name tables
// (~28 KB of maps, ~0.08 ms) are built on first use (Arch.Names), not then.
func TestInitStaysSmall(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	m := regexp.MustCompile(`(?m)^init github\.com/cube-dev/cube/internal/seccomp @.* ([0-9]+) bytes, ([0-9]+) allocs`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no init line for the package in:\n%s", out)
	}
	n, _ := strconv.Atoi(string(m[1]))
	t.Logf("package init: %d bytes, %s allocs", n, m[2])
	if n > 8<<10 {
		t.Errorf("package init allocates %d bytes, want at most 8 KiB (the name tables are built on first use)", n)
	}
}

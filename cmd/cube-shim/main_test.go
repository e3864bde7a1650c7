package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStaysSmall: the agent starts this binary three times per create (the
// shim, sandbox-init, the user namespace's workload process), so every
// package it links costs each of those starts its init and page faults.
// net/http, crypto/tls and cilium/ebpf came in through the agent's shim
// client and the cgroup v2 device filter: 6.0 -> 3.7 MB and ~0.5 ms of CPU
// per start, measured. Keep them out.
func TestStaysSmall(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"net/http", "crypto/tls", "crypto/x509", "github.com/cilium/ebpf"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("cube-shim links %s", dep)
			}
		}
	}
}

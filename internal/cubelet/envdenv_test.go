package cubelet

import (
	"slices"
	"testing"

	"github.com/cube-dev/cube/internal/envd"
)

// The node starts envd with envd's own start-up variables, and not when the
// code interpreter runs in front of it (its kernels would see them).
func TestEnvdStartupProcsEnv(t *testing.T) {
	plain := sandboxEnv([]string{sandboxEnvdPath, "--ready-fd", "3"})
	if !slices.Contains(plain, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Fatalf("no PATH in %q", plain)
	}
	for _, kv := range envd.StartupProcsEnv {
		if !slices.Contains(plain, kv) {
			t.Errorf("%s missing from envd's environment %q", kv, plain)
		}
	}
	withInterp := sandboxEnv(interpArgs([]string{sandboxEnvdPath, "--ready-fd", "3"}))
	if len(withInterp) != 1 {
		t.Fatalf("environment with the code interpreter in front: %q, want PATH only", withInterp)
	}
}

package nodeops

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/preflight"
)

func TestWaitPrep(t *testing.T) {
	dir := t.TempDir()
	genFile := filepath.Join(dir, "generation")
	os.WriteFile(genFile, []byte("4"), 0o644)
	envd := filepath.Join(dir, "artifacts", "envd")
	var out bytes.Buffer
	ctx := context.Background()
	if err := WaitPrep(ctx, &out, genFile, dir, nil, 50*time.Millisecond, 10*time.Millisecond); err == nil {
		t.Fatal("no fingerprint, no error")
	}
	rep := preflight.Check(preflight.Config{NodeCIDR: preflight.DefaultConfig().NodeCIDR, PortMin: 1, PortMax: 1},
		preflight.Facts{Filesystems: []string{"overlay"}, NFTables: preflight.Probe{OK: true}, NetNS: preflight.Probe{OK: true},
			CgroupControllers: []string{"cpu", "memory", "pids"}})
	fp, err := preflight.NewFingerprint(4, "n", "v", "k", rep, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	preflight.WriteFingerprint(dir, fp)
	if err := WaitPrep(ctx, &out, genFile, dir, []string{envd}, 50*time.Millisecond, 10*time.Millisecond); err == nil ||
		!strings.Contains(err.Error(), "cube-node-installer") {
		t.Fatalf("missing envd: %v", err)
	}
	os.MkdirAll(filepath.Dir(envd), 0o755)
	os.WriteFile(envd, []byte("x"), 0o755)
	if err := WaitPrep(ctx, &out, genFile, dir, []string{envd}, time.Second, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// A new generation waits again.
	os.WriteFile(genFile, []byte("5"), 0o644)
	if err := WaitPrep(ctx, &out, genFile, dir, nil, 50*time.Millisecond, 10*time.Millisecond); err == nil {
		t.Fatal("generation 5 has no fingerprint yet")
	}
}

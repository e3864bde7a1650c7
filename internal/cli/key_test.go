package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/store"
)

func TestKeyCommands(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(ctx, append(args, "--data-dir", dir), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, _ := run("key", "create", "--name", "ci")
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, store.KeyPrefix) {
		t.Fatalf("create: %d %q", code, out)
	}
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := st.VerifyKey(ctx, key)
	st.Close()
	if err != nil {
		t.Fatalf("created key does not verify: %v", err)
	}
	if code, out, _ := run("key", "ls"); code != 0 || !strings.Contains(out, id+"  ci") || !strings.Contains(out, "active") {
		t.Errorf("ls: %d\n%s", code, out)
	}
	if code, _, _ := run("key", "revoke", id); code != 0 {
		t.Errorf("revoke: %d", code)
	}
	st, err = store.OpenSQLite(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.VerifyKey(ctx, key); err == nil {
		t.Error("revoked key still verifies")
	}
	if code, out, _ := run("key", "ls"); !strings.Contains(out, "revoked") {
		t.Errorf("ls after revoke: %d\n%s", code, out)
	}
	if code, _, errOut := run("key", "revoke", "nope"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("revoke unknown: %d %q", code, errOut)
	}
	if code, _, _ := run("key", "frobnicate"); code != 2 {
		t.Errorf("unknown subcommand: %d, want 2", code)
	}
}

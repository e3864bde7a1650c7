package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/preflight"
)

func TestPreflightAndPrepCommands(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ctx := context.Background()
	var out, errb bytes.Buffer
	// Port 1 is free here; a CIDR from the shared range avoids this host's routes.
	base := []string{"--port-range", "1-1", "--node-cidr", "100.127.252.0/24", "--cni-conf-dir", t.TempDir()}
	if code := Run(ctx, append([]string{"preflight", "--json"}, base...), &out, &errb); code != 0 {
		t.Fatalf("preflight exit %d: %s %s", code, out.String(), errb.String())
	}
	var rep preflight.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || !rep.Passed || len(rep.Results) == 0 {
		t.Fatalf("report %s: %v", out.String(), err)
	}
	out.Reset()
	if code := Run(ctx, append([]string{"preflight", "--runtime", "vm"}, base...), &out, &errb); code != 1 && !rep.Passed {
		t.Fatalf("forced vm exit %d", code)
	} else if code == 1 && !strings.Contains(out.String(), "fail") {
		t.Fatalf("failing report: %s", out.String())
	}
	if code := Run(ctx, []string{"preflight", "--node-cidr", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("bad flag exit %d", code)
	}

	dir := filepath.Join(t.TempDir(), "prep")
	runDir := t.TempDir()
	args := append([]string{"prep", "--generation", "2", "--dir", dir, "--run-dir", runDir, "--node", "n1"}, base...)
	out.Reset()
	if code := Run(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("prep exit %d: %s %s", code, out.String(), errb.String())
	}
	if fp, err := preflight.ReadFingerprint(dir, 2); err != nil || fp.Node != "n1" {
		t.Fatalf("fingerprint %+v, %v", fp, err)
	}
	// A failing preflight writes nothing.
	failing := append([]string{"prep", "--generation", "3", "--dir", dir, "--run-dir", runDir, "--service-cidr", "100.127.0.0/16"}, base...)
	if code := Run(ctx, failing, &out, &errb); code != 1 {
		t.Fatalf("failing prep exit %d", code)
	}
	if _, err := os.Stat(preflight.FingerprintPath(dir, 3)); !os.IsNotExist(err) {
		t.Fatalf("fingerprint written for a failed preflight: %v", err)
	}
	if code := Run(ctx, []string{"prep"}, &out, &errb); code != 2 {
		t.Fatalf("prep without generation exit %d", code)
	}
}

func TestKubeCommandErrors(t *testing.T) {
	ctx := context.Background()
	var out, errb bytes.Buffer
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if code := Run(ctx, []string{"kube", "hostnet-preflight", "--namespace", "x"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "in-cluster config") {
		t.Fatalf("outside a cluster: exit %d %s", code, errb.String())
	}
	t.Setenv("POD_NAMESPACE", "")
	if code := Run(ctx, []string{"kube", "hostnet-preflight"}, &out, &errb); code != 2 {
		t.Fatalf("no namespace: exit %d", code)
	}
	if code := Run(ctx, []string{"kube", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("unknown: exit %d", code)
	}
	src, dst := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "envd"), []byte("e"), 0o755)
	out.Reset()
	if code := Run(ctx, []string{"kube", "install-artifacts", "--from", src, "--to", dst}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "installed 1 artifacts") {
		t.Fatalf("install: exit %d %s %s", code, out.String(), errb.String())
	}
}

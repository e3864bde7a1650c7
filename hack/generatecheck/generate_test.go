// Package generatecheck tests hack/generate.sh, the one entry point of `make
// generate`, on a copy of the repository's api/ tree.
package generatecheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// repoRoot is two levels above this file.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// copyTree copies the repository's generate.sh and api/ into a new temporary
// root, so the script can run there without touching the real tree.
func copyTree(t *testing.T) string {
	t.Helper()
	src := repoRoot(t)
	dst := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dst, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"cp", filepath.Join(src, "hack", "generate.sh"), filepath.Join(dst, "hack", "generate.sh")},
		{"cp", "-a", filepath.Join(src, "api"), filepath.Join(dst, "api")},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	return dst
}

func runGenerate(t *testing.T, root string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "generate.sh"))
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// snapshot reads every file under dir, keyed by relative path.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		files[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func sameFiles(t *testing.T, what string, want, got map[string][]byte) {
	t.Helper()
	if len(want) != len(got) {
		t.Errorf("%s: %d files, want %d", what, len(got), len(want))
	}
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			t.Errorf("%s: %s differs", what, name)
		}
	}
}

// The committed code is what the pinned tools generate (what check-generate
// checks in the real tree, here on a copy, with the tools from the cache).
func TestGenerateReproducesCommittedCode(t *testing.T) {
	root := copyTree(t)
	want := snapshot(t, filepath.Join(root, "api", "gen"))
	if err := os.RemoveAll(filepath.Join(root, "api", "gen")); err != nil {
		t.Fatal(err)
	}
	if out, err := runGenerate(t, root); err != nil {
		t.Fatalf("generate: %v\n%s", err, out)
	}
	sameFiles(t, "regenerated api/gen", want, snapshot(t, filepath.Join(root, "api", "gen")))
	leftovers, _ := filepath.Glob(filepath.Join(root, "api", ".gen.*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary directories left behind: %v", leftovers)
	}
}

// A failing step (here a proto that does not compile) leaves the committed
// code exactly as it was: before issue 19 the script had already removed
// api/gen/envd when protoc failed, and the next build could not compile.
func TestGenerateFailureLeavesTreeIntact(t *testing.T) {
	root := copyTree(t)
	before := snapshot(t, filepath.Join(root, "api", "gen"))
	// The node API is generated after envd: break it so envd's step has
	// already succeeded when the run fails.
	proto := filepath.Join(root, "api", "node", "v1", "node.proto")
	b, err := os.ReadFile(proto)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(proto, append(b, []byte("\nmessage Broken { NoSuchType x = 1; }\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runGenerate(t, root)
	if err == nil {
		t.Fatalf("generate succeeded on a broken proto:\n%s", out)
	}
	if !strings.Contains(out, "NoSuchType") {
		t.Errorf("the error does not name the problem:\n%s", out)
	}
	sameFiles(t, "api/gen after a failed generate", before, snapshot(t, filepath.Join(root, "api", "gen")))
	leftovers, _ := filepath.Glob(filepath.Join(root, "api", ".gen.*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary directories left behind: %v", leftovers)
	}
}

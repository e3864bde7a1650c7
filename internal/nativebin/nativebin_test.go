package nativebin

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBuildLinesMatch keeps the Makefile's and the Dockerfiles' gcc lines
// equal to Build's: the same flags and every program of Sources.
func TestBuildLinesMatch(t *testing.T) {
	root, err := moduleRoot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "images", "*", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "Makefile"))
	line := regexp.MustCompile(`gcc (.*?) -o \S*?([a-z-]+) (cmd/\S+\.c)`)
	want := strings.Join(Flags, " ")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, m := range line.FindAllStringSubmatch(string(b), -1) {
			if m[1] != want {
				t.Errorf("%s builds %s with gcc %s, want %s", f, m[2], m[1], want)
			}
			got[m[2]] = m[3]
		}
		if len(got) == 0 {
			continue // an image without C programs
		}
		for name, src := range Sources {
			if got[name] != src {
				t.Errorf("%s builds %s from %q, want %s", f, name, got[name], src)
			}
		}
	}
}

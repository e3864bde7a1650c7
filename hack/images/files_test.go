package main

import (
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/nativebin"
)

// TestInterpNextToEnvd requires cube-interp wherever an image carries envd,
// in the same directory: the cubelet binds the code-interpreter server into
// sandboxes from next to envd (cubelet.InterpName), so a node without it
// refuses every create of code-interpreter-v1. On a cluster that is the
// installer's /opt/cube/artifacts (copied to the host's
// /var/lib/cube/artifacts, the cubelet's --envd) and the cubelet image's
// /usr/local/bin.
func TestInterpNextToEnvd(t *testing.T) {
	carriers := 0
	for _, spec := range Specs("v1") {
		for p, bin := range spec.Files {
			if bin != "envd" {
				continue
			}
			carriers++
			want := path.Join(path.Dir(p), "cube-interp")
			if spec.Files[want] != "cube-interp" {
				t.Errorf("%s: envd at %s but no cube-interp at %s", spec.Name, p, want)
			}
		}
	}
	if carriers != 2 {
		t.Errorf("%d images carry envd, want 2 (cubelet, installer)", carriers)
	}
}

// TestSpecFilesAreBuilt checks that every binary an image carries is one
// buildBinaries builds, from its cmd/ package.
func TestSpecFilesAreBuilt(t *testing.T) {
	for _, spec := range Specs("v1") {
		for p, bin := range spec.Files {
			if src, ok := nativebin.Sources[bin]; ok {
				if !strings.HasPrefix(src, "cmd/"+bin+"/") {
					t.Errorf("binary %s is built from %s, want cmd/%s/", bin, src, bin)
				}
				continue
			}
			pkg, ok := Binaries[bin]
			if !ok {
				t.Errorf("%s: %s is %s, which hack/images does not build", spec.Name, p, bin)
				continue
			}
			if !strings.HasSuffix(pkg, "/cmd/"+bin) {
				t.Errorf("binary %s is built from %s, want .../cmd/%s", bin, pkg, bin)
			}
		}
	}
}

// TestDockerfilesCopyTheSpecFiles keeps the binaries of each
// deploy/images/<name>/Dockerfile equal to hack/images' Files: every
// `COPY --from=build` source lands at the same path, and every copied
// binary is built in the build stage.
func TestDockerfilesCopyTheSpecFiles(t *testing.T) {
	copyLine := regexp.MustCompile(`(?m)^COPY --from=build(?: --chmod=\d+)?((?: /out/[a-z-]+)+) (/\S+)$`)
	buildLine := regexp.MustCompile(`(?:go build -ldflags="\$ldflags"|gcc -static [^\n]*?) -o /out/([a-z-]+) \.?/?cmd/([a-z-]+)`)
	for _, spec := range Specs("v1") {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "images", spec.Name, "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		built := map[string]bool{}
		for _, m := range buildLine.FindAllStringSubmatch(string(b), -1) {
			if m[1] != m[2] {
				t.Errorf("%s: builds ./cmd/%s into /out/%s", spec.Name, m[2], m[1])
			}
			built[m[1]] = true
		}
		got := map[string]string{}
		for _, m := range copyLine.FindAllStringSubmatch(string(b), -1) {
			srcs, dst := strings.Fields(m[1]), m[2]
			for _, src := range srcs {
				bin := path.Base(src)
				p := dst
				if strings.HasSuffix(dst, "/") {
					p = path.Join(dst, bin)
				}
				got[p] = bin
				if !built[bin] {
					t.Errorf("%s: copies %s, which its build stage does not build", spec.Name, src)
				}
			}
		}
		if !maps.Equal(got, spec.Files) {
			t.Errorf("%s: Dockerfile copies %v, hack/images puts %v", spec.Name, sortedKeys(got), sortedKeys(spec.Files))
		}
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

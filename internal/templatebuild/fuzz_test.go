package templatebuild

import (
	"archive/tar"
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/template"
)

// A decoded spec holds only valid steps, whatever the body.
func FuzzDecodeSpec(f *testing.F) {
	f.Add([]byte(sdkBody))
	f.Add([]byte(`{"steps":[{"type":"ENV","args":["A","1"]}],"fromImage":"e2bdev/base"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"steps":[],"force":false,"fromImage":"ghcr.io/org/app:1","fromImageRegistry":{"type":"registry","username":"u","password":"p"}}`))
	f.Add([]byte(`{"steps":[],"fromImage":"ubuntu","fromImageRegistry":{"type":"gcp","serviceAccountJson":"{}"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		spec, err := DecodeSpec(body)
		if err != nil {
			return
		}
		// A parent is exactly one of a valid template name (with a tag
		// StartBuild resolves) and an image.
		if p, err := ParseParent(spec); err == nil {
			name, _, _ := strings.Cut(p.Template, ":")
			if (p.Template == "") == (p.Image == "") || (p.Template != "" && template.ValidateName(name) != nil) || (p.Auth != nil && p.Image == "") {
				t.Fatalf("parent %+v of %+v", p, spec)
			}
		}
		for i, st := range spec.Steps {
			if err := st.validate(); err != nil {
				t.Fatalf("step %d accepted but invalid: %v", i+1, err)
			}
			_ = st.describe()
		}
		_ = cacheKeys("p", spec.Steps)
	})
}

// Whatever the upload, the sanitised archive names no path outside the
// root and nothing below a symlink.
func FuzzSanitizeTar(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x1f\x8b garbage"))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"})
	tw.WriteHeader(&tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Size: 1})
	tw.Write([]byte("x"))
	tw.WriteHeader(&tar.Header{Name: "../y", Typeflag: tar.TypeReg})
	tw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		if err := sanitizeTar(bytes.NewReader(in), &out); err != nil {
			return
		}
		tr := tar.NewReader(&out)
		links := map[string]bool{}
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatalf("sanitised archive unreadable: %v", err)
			}
			name := strings.TrimSuffix(h.Name, "/")
			if c, ok := safeName(name); !ok || c != name {
				t.Fatalf("unsafe name %q", h.Name)
			}
			if underLink(name, links) {
				t.Fatalf("%q is below a symlink", h.Name)
			}
			if h.Typeflag == tar.TypeSymlink {
				links[name] = true
			} else {
				delete(links, name)
			}
		}
	})
}

package cubelet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

func TestInterpArgs(t *testing.T) {
	envd := []string{"/.cube/envd", "--ready-fd", "3", "--config", "/.cube/envd.json"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"envd alone", envd, append([]string{"/.cube/interp", "--"}, envd...)},
		{"under the reaper", append([]string{"/.cube/reaper", "--inherit-fd", "3", "--"}, envd...),
			append([]string{"/.cube/reaper", "--inherit-fd", "3", "--", "/.cube/interp", "--"}, envd...)},
		{"no envd", []string{"/bin/other"}, []string{"/bin/other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.args)
			if got := interpArgs(tc.args); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if !slices.Equal(in, tc.args) {
				t.Errorf("args changed: %q", tc.args)
			}
		})
	}
}

// Only templates with the marker get the server; a marker without the
// binary next to envd is a clear error.
func TestWithInterp(t *testing.T) {
	bin := t.TempDir()
	envdPath := filepath.Join(bin, "envd")
	if err := os.WriteFile(envdPath, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cubelet{cfg: Config{EnvdPath: envdPath}}
	plain, withMarker := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(withMarker, filepath.Dir(template.InterpMarker)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withMarker, template.InterpMarker), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{sandboxEnvdPath}
	binds := []nsrt.Bind{{Source: envdPath, Target: sandboxEnvdPath, ReadOnly: true}}

	gotArgs, gotBinds, err := c.withInterp(plain, args, binds)
	if err != nil || !slices.Equal(gotArgs, args) || len(gotBinds) != 1 {
		t.Errorf("plain template: %q %v %v", gotArgs, gotBinds, err)
	}
	if _, _, err := c.withInterp(withMarker, args, binds); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("marker without binary: %v", err)
	}
	if err := os.WriteFile(filepath.Join(bin, InterpName), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	gotArgs, gotBinds, err = c.withInterp(withMarker, args, binds)
	if err != nil || gotArgs[0] != sandboxInterpPath || len(gotBinds) != 2 ||
		gotBinds[1] != (nsrt.Bind{Source: filepath.Join(bin, InterpName), Target: sandboxInterpPath, ReadOnly: true}) {
		t.Errorf("code-interpreter template: %q %v %v", gotArgs, gotBinds, err)
	}
}

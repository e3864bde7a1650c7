package cubelet

import (
	"encoding/json"
	"testing"

	"github.com/cube-dev/cube/internal/envd"
	"github.com/cube-dev/cube/internal/template"
)

func TestEnvdConfigTemplateDefaults(t *testing.T) {
	tests := []struct {
		name string
		req  map[string]string
		d    *template.Defaults
		want envd.Config
	}{
		{"no defaults", map[string]string{"A": "1"}, nil,
			envd.Config{AccessToken: "tok", EnvVars: map[string]string{"A": "1"}, DefaultUser: "user"}},
		{"image defaults, request env wins", map[string]string{"A": "req"},
			&template.Defaults{Env: map[string]string{"A": "img", "PATH": "/opt/bin:/bin"}, User: "app", Workdir: "/srv"},
			envd.Config{AccessToken: "tok", EnvVars: map[string]string{"A": "req", "PATH": "/opt/bin:/bin"}, DefaultUser: "app", DefaultWorkdir: "/srv"}},
		{"unresolved image user keeps cube's default", nil,
			&template.Defaults{ImageUser: "4242"},
			envd.Config{AccessToken: "tok", DefaultUser: "user"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(envdConfig("tok", tc.req, tc.d))
			if err != nil {
				t.Fatal(err)
			}
			var got envd.Config
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(tc.want)
			if string(gb) != string(wb) {
				t.Errorf("envd config %s, want %s", gb, wb)
			}
		})
	}
}

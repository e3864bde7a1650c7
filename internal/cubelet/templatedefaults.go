package cubelet

import (
	"maps"

	"github.com/cube-dev/cube/internal/template"
)

// envdConfig is envd's start-up configuration (/.cube/envd.json) for a
// sandbox of a template with defaults d (nil for most templates): the
// template's environment under the request's, and the template's default
// user and working directory, if it names them (an image's USER and
// WORKDIR). A pre-started pool slot of the template starts with the same
// file; a create that takes it adds the request's variables through /init.
func envdConfig(token string, envVars map[string]string, d *template.Defaults) map[string]any {
	cfg := map[string]any{
		"accessToken": token,
		"envVars":     envVars,
		"defaultUser": envdDefaultUser,
	}
	if d == nil {
		return cfg
	}
	if len(d.Env) > 0 {
		env := maps.Clone(d.Env)
		maps.Copy(env, envVars)
		cfg["envVars"] = env
	}
	if d.User != "" {
		cfg["defaultUser"] = d.User
	}
	if d.Workdir != "" {
		cfg["defaultWorkdir"] = d.Workdir
	}
	return cfg
}

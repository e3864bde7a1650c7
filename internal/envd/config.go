// Package envd is the in-sandbox agent: it serves the E2B envd protocol
// (process and filesystem Connect services, /files, /health, /init, /envs)
// on port 49983 inside every sandbox.
package envd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Version is the E2B envd protocol version this agent implements (the SDK
// gates features on it: 0.5.7 = closeStdin and octet-stream/gzip uploads).
const Version = "0.5.7"

// DefaultConfigFile is where envd reads its start-up configuration.
const DefaultConfigFile = "/.cube/envd.json"

// DefaultAddr is envd's listen address.
const DefaultAddr = "0.0.0.0:49983"

// Config is envd's start-up configuration; /init may change the first four
// fields later.
type Config struct {
	// AccessToken, when set, is required in X-Access-Token on every route
	// except /health.
	AccessToken string `json:"accessToken,omitempty"`
	// EnvVars are added to every process's environment.
	EnvVars map[string]string `json:"envVars,omitempty"`
	// DefaultUser runs commands when a request names no user ("user" if empty).
	DefaultUser string `json:"defaultUser,omitempty"`
	// DefaultWorkdir is the cwd of commands without one (the user's home if empty).
	DefaultWorkdir string `json:"defaultWorkdir,omitempty"`
	// PasswdFile and GroupFile are the account databases (/etc/passwd and
	// /etc/group if empty).
	PasswdFile string `json:"passwdFile,omitempty"`
	GroupFile  string `json:"groupFile,omitempty"`
}

// LoadConfig reads a JSON Config from path. A missing file yields the zero
// Config; malformed JSON is ErrInvalidArgument.
func LoadConfig(path string) (Config, error) {
	var cfg Config
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("read envd config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return Config{}, fmt.Errorf("parse envd config %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

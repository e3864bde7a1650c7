package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Defaults are what a container image's config asks of the processes
// started in it, recorded with the template.
type Defaults struct {
	// Env is the image's environment (Env), added to every process's.
	Env map[string]string `json:"env,omitempty"`
	// Workdir is the default working directory (WorkingDir); empty means
	// the user's home.
	Workdir string `json:"workdir,omitempty"`
	// User is the sandbox's default user, the passwd name of the image's
	// USER; empty means Cube's default ("user"), also when USER names no
	// entry of the image's /etc/passwd.
	User string `json:"user,omitempty"`
	// ImageUser is USER as the image config spells it ("app", "1000:1000").
	ImageUser string `json:"imageUser,omitempty"`
	// Entrypoint and Cmd are recorded for a template start command; Cube
	// does not run them by itself.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// StartCmd is started (sh -c, detached) in every sandbox made from the
	// template, as User in Workdir; a create returns once ReadyCmd exits 0
	// (see cubelet's start step). Set by template builds.
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
	// Syscalls are system calls this template's sandboxes may make beyond
	// Cube's allowlist, unconditionally (docs/security.md); set by the
	// operator with `cube template create --allow-syscall`.
	Syscalls []string `json:"syscalls,omitempty"`
}

// imageDefaults turns the image config into Defaults, resolving USER
// against the prepared rootfs's /etc/passwd and creating a missing
// WorkingDir (as a container runtime does).
func imageDefaults(rootfs string, cfg *v1.Config) (*Defaults, error) {
	if cfg == nil {
		return nil, nil
	}
	d := &Defaults{ImageUser: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd}
	for _, kv := range cfg.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if d.Env == nil {
			d.Env = map[string]string{}
		}
		d.Env[k] = v
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if cfg.WorkingDir != "" {
		d.Workdir = path.Clean("/" + cfg.WorkingDir)
		fi, err := root.Stat(strings.TrimPrefix(d.Workdir, "/"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := root.MkdirAll(strings.TrimPrefix(d.Workdir, "/"), 0o755); err != nil {
				return nil, fmt.Errorf("create working dir %s: %w", d.Workdir, err)
			}
		case err != nil:
			return nil, fmt.Errorf("working dir %s: %v: %w", d.Workdir, err, errdefs.ErrInvalidArgument)
		case !fi.IsDir():
			return nil, fmt.Errorf("working dir %s is not a directory in the image: %w", d.Workdir, errdefs.ErrInvalidArgument)
		}
	}
	d.User = passwdName(root, cfg.User)
	return d, nil
}

// passwdName returns the passwd name of an image USER ("name", "uid",
// "name:group", "uid:gid"), or "" when it is unset or unknown.
func passwdName(root *os.Root, user string) string {
	u, _, _ := strings.Cut(user, ":")
	if u == "" {
		return ""
	}
	data, err := root.ReadFile("etc/passwd")
	if err != nil {
		return ""
	}
	_, numErr := strconv.ParseUint(u, 10, 32)
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ":")
		if len(f) < 7 {
			continue
		}
		if f[0] == u || (numErr == nil && f[2] == u) {
			return f[0]
		}
	}
	return ""
}

// DefaultsJSON is t's Defaults as template.json records them, for the
// node protocol and the control-plane store; nil for none.
func (t Template) DefaultsJSON() ([]byte, error) {
	if t.Defaults == nil {
		return nil, nil
	}
	b, err := json.Marshal(t.Defaults)
	if err != nil {
		return nil, fmt.Errorf("template %s defaults: %w", t.Name, err)
	}
	return b, nil
}

// ParseDefaults reads defaults as DefaultsJSON wrote them; nil for none
// (empty or JSON null).
func ParseDefaults(raw []byte) (*Defaults, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var d Defaults
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("template defaults: %w", err)
	}
	return &d, nil
}

// ImageStartCmd is the shell command (sh -c) that runs an image's
// ENTRYPOINT followed by its CMD, each argument quoted for the shell, as
// a container runtime would exec them; "" when the image has neither.
func ImageStartCmd(entrypoint, cmd []string) string {
	args := append(append([]string(nil), entrypoint...), cmd...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}

// shellQuote returns s as one word of a POSIX shell command.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

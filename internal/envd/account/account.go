// Package account resolves sandbox users from passwd/group files and holds the
// sandbox-wide defaults (default user, default workdir, environment) that
// envd's /init call may change at run time.
package account

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Default locations of the account databases inside a sandbox.
const (
	DefaultPasswdFile = "/etc/passwd"
	DefaultGroupFile  = "/etc/group"
	// DefaultUser is the user commands run as when neither the request nor
	// the configuration names one (E2B's convention).
	DefaultUser = "user"
)

// User is one resolved passwd entry plus its supplementary groups.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
	Shell  string
}

// Settings resolves users and holds sandbox-wide defaults. It is safe for
// concurrent use.
type Settings struct {
	passwdFile string
	groupFile  string

	mu             sync.RWMutex
	defaultUser    string
	defaultWorkdir string
	envVars        map[string]string
}

// NewSettings returns Settings reading the given passwd and group files
// (empty means the system defaults).
func NewSettings(passwdFile, groupFile string) *Settings {
	if passwdFile == "" {
		passwdFile = DefaultPasswdFile
	}
	if groupFile == "" {
		groupFile = DefaultGroupFile
	}
	return &Settings{passwdFile: passwdFile, groupFile: groupFile, defaultUser: DefaultUser}
}

// SetDefaultUser changes the user used when a request names none; empty
// restores DefaultUser.
func (s *Settings) SetDefaultUser(name string) {
	if name == "" {
		name = DefaultUser
	}
	s.mu.Lock()
	s.defaultUser = name
	s.mu.Unlock()
}

// SetDefaultWorkdir changes the default working directory of new processes;
// empty means the user's home.
func (s *Settings) SetDefaultWorkdir(dir string) {
	s.mu.Lock()
	s.defaultWorkdir = dir
	s.mu.Unlock()
}

// MergeEnvVars adds (or replaces) sandbox environment variables.
func (s *Settings) MergeEnvVars(vars map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.envVars == nil && len(vars) > 0 {
		s.envVars = make(map[string]string, len(vars))
	}
	for k, v := range vars {
		s.envVars[k] = v
	}
}

// EnvVars returns a copy of the sandbox environment variables.
func (s *Settings) EnvVars() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]string, len(s.envVars))
	for k, v := range s.envVars {
		out[k] = v
	}
	return out
}

// DefaultWorkdir returns the configured default working directory ("" = home).
func (s *Settings) DefaultWorkdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.defaultWorkdir
}

// Lookup resolves a user by name; an empty name means the default user.
// Unknown users are ErrInvalidArgument (the caller asked for something that
// does not exist in this sandbox).
func (s *Settings) Lookup(name string) (User, error) {
	if name == "" {
		s.mu.RLock()
		name = s.defaultUser
		s.mu.RUnlock()
	}
	if strings.ContainsAny(name, ":\n\x00") {
		return User{}, fmt.Errorf("user %q: bad name: %w", name, errdefs.ErrInvalidArgument)
	}
	u, err := lookupPasswd(s.passwdFile, func(f []string) bool { return f[0] == name })
	if err != nil {
		return User{}, fmt.Errorf("user %q: %w", name, err)
	}
	u.Groups = supplementaryGroups(s.groupFile, u.Name, u.GID)
	return u, nil
}

// UserName returns the name of uid, or its decimal form when unknown.
func (s *Settings) UserName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	u, err := lookupPasswd(s.passwdFile, func(f []string) bool { return f[2] == id })
	if err != nil {
		return id
	}
	return u.Name
}

// GroupName returns the name of gid, or its decimal form when unknown.
func (s *Settings) GroupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	name := id
	_ = scanColonFile(s.groupFile, 3, func(f []string) bool {
		if f[2] == id {
			name = f[0]
			return true
		}
		return false
	})
	return name
}

func lookupPasswd(file string, match func([]string) bool) (User, error) {
	var u User
	found := false
	var perr error
	err := scanColonFile(file, 7, func(f []string) bool {
		if !match(f) {
			return false
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			perr = fmt.Errorf("bad passwd entry for %q in %s: %w", f[0], file, errdefs.ErrFailedPrecondition)
			return true
		}
		u = User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		if u.Home == "" {
			u.Home = "/"
		}
		found = true
		return true
	})
	switch {
	case err != nil:
		return User{}, err
	case perr != nil:
		return User{}, perr
	case !found:
		return User{}, fmt.Errorf("no such user in %s: %w", file, errdefs.ErrInvalidArgument)
	}
	return u, nil
}

func supplementaryGroups(file, user string, primary uint32) []uint32 {
	groups := []uint32{primary}
	_ = scanColonFile(file, 4, func(f []string) bool {
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == primary {
			return false
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == user {
				groups = append(groups, uint32(gid))
				break
			}
		}
		return false
	})
	return groups
}

// scanColonFile calls fn for every line of a colon-separated database with at
// least n fields, until fn returns true.
func scanColonFile(file string, n int, fn func([]string) bool) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("open account database: %w", errdefs.ErrUnavailable)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < n {
			continue
		}
		if fn(fields) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", file, errdefs.ErrUnavailable)
	}
	return nil
}

// UsernameFromAuthorization extracts the user name from an envd
// "Authorization: Basic base64(user:)" header. An empty header yields "".
func UsernameFromAuthorization(header string) (string, error) {
	if header == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", fmt.Errorf("authorization: want Basic credentials: %w", errdefs.ErrInvalidArgument)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", fmt.Errorf("authorization: bad base64: %w", errdefs.ErrInvalidArgument)
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, nil
}

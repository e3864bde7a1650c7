package account

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func writeDB(t *testing.T, passwd, group string) *Settings {
	t.Helper()
	dir := t.TempDir()
	p, g := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	if err := os.WriteFile(p, []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g, []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	return NewSettings(p, g)
}

func TestLookup(t *testing.T) {
	s := writeDB(t,
		"root:x:0:0:root:/root:/bin/bash\n\n# c\nshort:x:1\nuser:x:1000:1000:User:/home/user:/bin/bash\nbad:x:abc:1::/h:/bin/sh\nnohome:x:5:5:::\n",
		"root:x:0:\nuser:x:1000:\nsudo:x:27:user\ndocker:x:999:alice,user\nother:x:50:alice\nbroken:x:zz:user\n")
	u, err := s.Lookup("")
	if err != nil {
		t.Fatal(err)
	}
	want := User{Name: "user", UID: 1000, GID: 1000, Groups: []uint32{1000, 27, 999}, Home: "/home/user", Shell: "/bin/bash"}
	if !reflect.DeepEqual(u, want) {
		t.Errorf("default user = %+v, want %+v", u, want)
	}
	s.SetDefaultUser("root")
	if u, err := s.Lookup(""); err != nil || u.UID != 0 || u.Home != "/root" {
		t.Errorf("root = %+v, %v", u, err)
	}
	if u, err := s.Lookup("nohome"); err != nil || u.Home != "/" {
		t.Errorf("nohome = %+v, %v", u, err)
	}
	for name, kind := range map[string]error{
		"ghost":  errdefs.ErrInvalidArgument,
		"a:b":    errdefs.ErrInvalidArgument,
		"bad":    errdefs.ErrFailedPrecondition,
		"x\x00y": errdefs.ErrInvalidArgument,
	} {
		if _, err := s.Lookup(name); !errors.Is(err, kind) {
			t.Errorf("Lookup(%q) = %v, want %v", name, err, kind)
		}
	}
	if got := s.UserName(1000); got != "user" {
		t.Errorf("UserName(1000) = %q", got)
	}
	if got := s.UserName(4242); got != "4242" {
		t.Errorf("UserName(4242) = %q", got)
	}
	if got := s.GroupName(27); got != "sudo" {
		t.Errorf("GroupName(27) = %q", got)
	}
	if got := s.GroupName(4242); got != "4242" {
		t.Errorf("GroupName(4242) = %q", got)
	}

	missing := NewSettings(filepath.Join(t.TempDir(), "nope"), "")
	if _, err := missing.Lookup("root"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("missing passwd: %v", err)
	}
}

func TestSettingsDefaults(t *testing.T) {
	s := NewSettings("", "")
	if s.passwdFile != DefaultPasswdFile || s.groupFile != DefaultGroupFile {
		t.Fatal("defaults not applied")
	}
	s.MergeEnvVars(map[string]string{"A": "1"})
	s.MergeEnvVars(map[string]string{"B": "2", "A": "3"})
	env := s.EnvVars()
	env["C"] = "mutated"
	if got := s.EnvVars(); !reflect.DeepEqual(got, map[string]string{"A": "3", "B": "2"}) {
		t.Errorf("env = %v", got)
	}
	s.SetDefaultWorkdir("/w")
	if s.DefaultWorkdir() != "/w" {
		t.Error("workdir not set")
	}
	s.SetDefaultUser("")
	if s.defaultUser != DefaultUser {
		t.Error("empty default user not reset")
	}
}

func TestUsernameFromAuthorization(t *testing.T) {
	b := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"", "", true},
		{b("root:"), "root", true},
		{b("user"), "user", true},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("x:pw")), "x", true},
		{"Bearer abc", "", false},
		{"Basic", "", false},
		{"Basic ***", "", false},
	}
	for _, c := range cases {
		got, err := UsernameFromAuthorization(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("UsernameFromAuthorization(%q) = %q, %v", c.in, got, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("error kind: %v", err)
		}
	}
}

func TestResolvePath(t *testing.T) {
	cases := []struct{ p, base, want string }{
		{"", "/home/u", "/home/u"},
		{"~", "/home/u", "/home/u"},
		{"~/a/../b", "/home/u", "/home/u/b"},
		{"rel/x", "/home/u", "/home/u/rel/x"},
		{"../../../etc", "/home/u", "/etc"},
		{"/abs//x/", "/home/u", "/abs/x"},
		{"x", "", "/x"},
		{"x", "relative-base", "/x"},
		{"~user", "/home/u", "/home/u/~user"},
	}
	for _, c := range cases {
		got, err := ResolvePath(c.p, c.base)
		if err != nil || got != c.want {
			t.Errorf("ResolvePath(%q, %q) = %q, %v; want %q", c.p, c.base, got, err, c.want)
		}
	}
	if _, err := ResolvePath("a\x00b", "/"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NUL path: %v", err)
	}
}

func FuzzResolvePath(f *testing.F) {
	f.Add("", "/home/user")
	f.Add("~/x", "/root")
	f.Fuzz(func(t *testing.T, p, base string) {
		got, err := ResolvePath(p, base)
		if err != nil {
			if !strings.ContainsRune(p, 0) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ResolvePath(%q, %q) failed: %v", p, base, err)
			}
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("ResolvePath(%q, %q) = %q: not absolute and clean", p, base, got)
		}
		if filepath.IsAbs(p) && got != filepath.Clean(p) {
			t.Fatalf("absolute %q became %q", p, got)
		}
	})
}

func FuzzUsernameFromAuthorization(f *testing.F) {
	f.Add("Basic dXNlcjo=")
	f.Fuzz(func(t *testing.T, h string) {
		name, err := UsernameFromAuthorization(h)
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		if strings.Contains(name, ":") {
			t.Fatalf("name %q contains ':'", name)
		}
	})
}

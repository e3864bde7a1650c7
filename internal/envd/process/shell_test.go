package process

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/envd/account"
)

// withShells points the fallback's shells at bash and sh for one test.
func withShells(t *testing.T, bash, sh string) {
	t.Helper()
	old := shells
	shells.bash, shells.sh = bash, sh
	t.Cleanup(func() { shells = old })
}

func TestShellFallbackOnlyForTheSDKForm(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-bash")
	cfg := func(cmd string, args ...string) *pb.ProcessConfig {
		return &pb.ProcessConfig{Cmd: cmd, Args: args, Envs: map[string]string{"A": "b"}}
	}
	cases := []struct {
		name       string
		bash, sh   string
		in         *pb.ProcessConfig
		wantFellTo string // "" = unchanged
	}{
		{"sdk form without bash", missing, "/bin/sh", cfg("/bin/bash", "-l", "-c", "echo hi"), "/bin/sh"},
		{"bash present", "/bin/sh", "/bin/sh", cfg("/bin/bash", "-l", "-c", "echo hi"), ""},
		{"no sh either", missing, missing + "-sh", cfg("/bin/bash", "-l", "-c", "echo hi"), ""},
		{"pty form", missing, "/bin/sh", cfg("/bin/bash", "-i", "-l"), ""},
		{"without -l", missing, "/bin/sh", cfg("/bin/bash", "-c", "echo hi"), ""},
		{"extra argument", missing, "/bin/sh", cfg("/bin/bash", "-l", "-c", "echo $0", "name"), ""},
		{"bash by name", missing, "/bin/sh", cfg("bash", "-l", "-c", "echo hi"), ""},
		{"another program", missing, "/bin/sh", cfg("/usr/bin/env", "-l", "-c", "x"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withShells(t, c.bash, c.sh)
			before := proto.Clone(c.in)
			got := shellFallback(c.in)
			if !proto.Equal(c.in, before) {
				t.Fatalf("the request was modified: %v", c.in)
			}
			if c.wantFellTo == "" {
				if got != c.in {
					t.Fatalf("rewritten to %v, want the request as is", got)
				}
				return
			}
			want := proto.Clone(c.in).(*pb.ProcessConfig)
			want.Cmd = c.wantFellTo
			if !proto.Equal(got, want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		})
	}
}

// TestShellFallbackRuns starts the SDK's command form as the current user
// (no root needed) with bash pointed at a missing path: /bin/sh runs it as
// a login shell (~/.profile read), with the exit code and output of the
// command, and the process reports /bin/sh as its command.
func TestShellFallbackRuns(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh on this host")
	}
	withShells(t, filepath.Join(t.TempDir(), "no-bash"), "/bin/sh")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(me.Uid)
	gid, _ := strconv.Atoi(me.Gid)
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, ".profile"), []byte("export FROM_PROFILE=login\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	u := account.User{Name: me.Username, UID: uint32(uid), GID: uint32(gid), Home: home}
	req := spawnRequest{
		config: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", `echo "$0 $FROM_PROFILE $REQ"; echo err >&2; exit 7`},
			Envs: map[string]string{"REQ": "env"}},
		user: u,
	}
	p, sub, err := spawn(req, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	p.run(func() {})
	if p.config.GetCmd() != "/bin/sh" || req.config.GetCmd() != "/bin/bash" {
		t.Errorf("process config cmd %q (request %q), want /bin/sh", p.config.GetCmd(), req.config.GetCmd())
	}
	var stdout, stderr string
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-sub.ch:
			if d := ev.GetData(); d != nil {
				stdout += string(d.GetStdout())
				stderr += string(d.GetStderr())
			}
			if end := ev.GetEnd(); end != nil {
				if end.GetExitCode() != 7 || stdout != "/bin/sh login env\n" || stderr != "err\n" {
					t.Fatalf("exit %d, stdout %q, stderr %q", end.GetExitCode(), stdout, stderr)
				}
				return
			}
		case <-timeout:
			t.Fatalf("no end event; stdout so far %q", stdout)
		}
	}
}

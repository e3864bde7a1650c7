package process

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/errdefs"
)

func TestEnviron(t *testing.T) {
	u := account.User{Name: "u", Home: "/home/u"}
	list, m, err := environ(u, map[string]string{"A": "sandbox", "PATH": "/sbx"}, map[string]string{"A": "request", "B": "b"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A=request", "B=b", "HOME=/home/u", "LOGNAME=u", "PATH=/sbx", "USER=u"}
	if !reflect.DeepEqual(list, want) || m["PATH"] != "/sbx" {
		t.Fatalf("environ = %v", list)
	}
	for _, bad := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A": "x\x00y"}} {
		if _, _, err := environ(u, nil, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("environ(%q) = %v", bad, err)
		}
	}
}

func TestWorkdirAndLookPath(t *testing.T) {
	home := t.TempDir()
	if err := os.Mkdir(filepath.Join(home, "w"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	u := account.User{Home: home}
	s := func(v string) *string { return &v }
	cases := []struct {
		cwd        *string
		defaultDir string
		want       string
		ok         bool
	}{
		{nil, "", home, true},
		{s(""), "", home, true},
		{nil, filepath.Join(home, "w"), filepath.Join(home, "w"), true},
		{s("w"), "", filepath.Join(home, "w"), true},
		{s("~/w"), "/elsewhere", filepath.Join(home, "w"), true},
		{s("missing"), "", "", false},
		{s("file"), "", "", false},
	}
	for _, c := range cases {
		got, err := workdir(&pb.ProcessConfig{Cwd: c.cwd}, u, c.defaultDir)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("workdir(%v, %q) = %q, %v", c.cwd, c.defaultDir, got, err)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("error kind %v", err)
		}
	}

	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	if got, err := lookPath("sh", filepath.Dir(sh), "/"); err != nil || got != filepath.Join(filepath.Dir(sh), "sh") {
		t.Errorf("lookPath(sh) = %q, %v", got, err)
	}
	for _, bad := range []string{"definitely-not-a-command", "./file", filepath.Join(home, "w")} {
		if _, err := lookPath(bad, "/usr/bin:/bin", home); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("lookPath(%q) = %v", bad, err)
		}
	}
}

func TestHeaderDuration(t *testing.T) {
	h := http.Header{}
	for v, want := range map[string]time.Duration{"": 0, "x": 0, "-5": 0, "0": 0, "1500": 1500 * time.Millisecond, "99999999999999999": 0} {
		h.Set("T", v)
		if got := headerDuration(h, "T", time.Millisecond); got != want {
			t.Errorf("headerDuration(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestRingIsBounded(t *testing.T) {
	p := &proc{subs: map[*subscriber]struct{}{}}
	chunk := make([]byte, 10<<10)
	for range 100 {
		p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{
			Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: chunk}}}}, true)
	}
	if p.ringBytes > ringLimit || p.ringBytes < ringLimit-len(chunk) {
		t.Fatalf("ring holds %d bytes, limit %d", p.ringBytes, ringLimit)
	}
	_, past := p.subscribe(true)
	if len(past)*len(chunk) != p.ringBytes {
		t.Fatalf("replay has %d events for %d bytes", len(past), p.ringBytes)
	}
}

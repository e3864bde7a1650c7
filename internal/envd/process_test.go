package envd_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/envd"
)

func TestStartOutputExitCodeEnvCwd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)

	req := connect.NewRequest(startCmd(`echo out; echo err >&2; printf '%s|%s|%s|%s|%s|' "$SANDBOX_VAR" "$OVERRIDE" "$HOME" "$USER" "$(pwd)"; exit 3`))
	req.Msg.Process.Envs = map[string]string{"OVERRIDE": "request"}
	req.Header().Set("Keepalive-Ping-Interval", "50")
	s, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if r.pid == 0 {
		t.Fatal("no pid in start event")
	}
	want := "out\nsbx|request|" + e.rootDir + "|root|" + e.rootDir + "|"
	if string(r.stdout) != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	if string(r.stderr) != "err\n" {
		t.Errorf("stderr = %q", r.stderr)
	}
	if r.end == nil || r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" || r.end.GetError() != "exit status 3" {
		t.Errorf("end = %v, want exit status 3", r.end)
	}

	// Explicit cwd, relative to home; success has no error field.
	req = connect.NewRequest(startCmd("pwd"))
	cwd := "sub"
	req.Msg.Process.Cwd = &cwd
	if err := mkdirAll(e.rootDir + "/sub"); err != nil {
		t.Fatal(err)
	}
	s, err = e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r = collect(t, s)
	if strings.TrimSpace(string(r.stdout)) != e.rootDir+"/sub" || r.end.GetExitCode() != 0 || r.end.Error != nil {
		t.Errorf("cwd run: stdout %q end %v", r.stdout, r.end)
	}
}

func TestStartBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	missing := "/definitely/not/here"
	cases := map[string]struct {
		req  *pb.StartRequest
		auth string
		code connect.Code
	}{
		"missing cwd":     {req: &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Cwd: &missing}}, code: connect.CodeInvalidArgument},
		"no process":      {req: &pb.StartRequest{}, code: connect.CodeInvalidArgument},
		"empty cmd":       {req: &pb.StartRequest{Process: &pb.ProcessConfig{}}, code: connect.CodeInvalidArgument},
		"unknown command": {req: &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "no-such-cmd-xyz"}}, code: connect.CodeInvalidArgument},
		"bad env name":    {req: &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Envs: map[string]string{"A=B": "x"}}}, code: connect.CodeInvalidArgument},
		"unknown user":    {req: &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}, auth: basicUser("nobody-here"), code: connect.CodeInvalidArgument},
		"bad auth header": {req: &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true"}}, auth: "Basic !!!", code: connect.CodeInvalidArgument},
		"nul in arg":      {req: &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/true", Args: []string{"a\x00b"}}}, code: connect.CodeInvalidArgument},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			req := connect.NewRequest(c.req)
			if c.auth != "" {
				req.Header().Set("Authorization", c.auth)
			}
			s, err := e.proc.Start(ctx, req)
			if err == nil {
				for s.Receive() {
					t.Errorf("unexpected event %v", s.Msg())
				}
				err = s.Err()
			}
			wantCode(t, err, c.code)
		})
	}
	// Nothing was left running.
	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.Msg.GetProcesses()); n != 0 {
		t.Errorf("%d processes left after failed starts", n)
	}
}

func TestStartAsNonRootUser(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(startCmd(`echo "$(id -u) $(id -g) $(id -G) $HOME $USER $LOGNAME $(pwd)"`))
	req.Header().Set("Authorization", basicUser("tester"))
	s, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	want := "1000 1000 1000 2345 " + e.userDir + " tester tester " + e.userDir
	if got := strings.TrimSpace(string(r.stdout)); got != want {
		t.Errorf("got %q, want %q (stderr %q)", got, want, r.stderr)
	}

	// Root is selectable explicitly too.
	req = connect.NewRequest(startCmd(`id -u`))
	req.Header().Set("Authorization", basicUser("root"))
	s, err = e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); strings.TrimSpace(string(r.stdout)) != "0" {
		t.Errorf("root run printed %q", r.stdout)
	}
}

func TestBackgroundConnectAndSignal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)

	// Start, read the start event and the first line, then disconnect.
	tag := "bg-" + t.Name()
	req := connect.NewRequest(startCmd(`echo first; read x; echo "got $x"; sleep 60`))
	yes := true
	req.Msg.Stdin = &yes
	req.Msg.Tag = &tag
	sctx, cancel := context.WithCancel(ctx)
	s, err := e.proc.Start(sctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	if !s.Receive() || string(s.Msg().GetEvent().GetData().GetStdout()) != "first\n" {
		t.Fatalf("want first line, got %v %v", s.Msg(), s.Err())
	}
	cancel()
	_ = s.Close()

	// Still running and listed after the client left.
	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid && p.GetTag() == tag && p.GetConfig().GetCmd() == "/bin/sh" {
			found = true
		}
	}
	if !found {
		t.Fatalf("pid %d not in list %v", pid, list.Msg)
	}

	// Input while nobody is attached; the output lands in the backlog.
	in := connect.NewRequest(&pb.SendInputRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Input:   &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}},
	})
	if _, err := e.proc.SendInput(ctx, in); err != nil {
		t.Fatal(err)
	}

	// Reattach by tag, kill, and expect the backlog and a signal end.
	cs, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !cs.Receive() || cs.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect: want start with pid %d, got %v %v", pid, cs.Msg(), cs.Err())
	}
	var out []byte
	for !strings.Contains(string(out), "got hello\n") && cs.Receive() {
		out = append(out, cs.Msg().GetEvent().GetData().GetStdout()...)
	}
	if !strings.HasPrefix(string(out), "first\ngot hello\n") {
		t.Fatalf("connect backlog = %q", out)
	}
	sig := connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}},
		Signal:  pb.Signal_SIGNAL_SIGKILL,
	})
	if _, err := e.proc.SendSignal(ctx, sig); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for cs.Receive() {
		if end = cs.Msg().GetEvent().GetEnd(); end != nil {
			break
		}
	}
	if end == nil || end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %v (%v), want signal: killed", end, cs.Err())
	}

	// Finished processes leave the list; signals and connects then miss.
	waitGone(t, e, pid)
	_, err = e.proc.SendSignal(ctx, sig)
	wantCode(t, err, connect.CodeNotFound)
	cs2, err := e.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err == nil {
		cs2.Receive()
		err = cs2.Err()
	}
	wantCode(t, err, connect.CodeNotFound)
}

// waitGone waits until pid left the process list.
func waitGone(t *testing.T, e *env, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		list, err := e.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		gone := true
		for _, p := range list.Msg.GetProcesses() {
			gone = gone && p.GetPid() != pid
		}
		if gone {
			return
		}
		time.Sleep(10 * time.Millisecond) // List has no change notification
	}
	t.Fatalf("pid %d still listed", pid)
}

func TestStdinAndCloseStdin(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}}) // stdin absent = pipe
	s, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	for _, chunk := range []string{"abc", "def\n"} {
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
			Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(chunk)}}})); err != nil {
			t.Fatal(err)
		}
	}
	// PTY input to a pipe process is refused.
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
		Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte("x")}}}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	_, err = e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 10, Rows: 10}}}))
	wantCode(t, err, connect.CodeFailedPrecondition)

	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var out []byte
	var end *pb.ProcessEvent_EndEvent
	for s.Receive() {
		out = append(out, s.Msg().GetEvent().GetData().GetStdout()...)
		if e := s.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if string(out) != "abcdef\n" || end == nil || end.GetExitCode() != 0 {
		t.Fatalf("cat output %q end %v err %v", out, end, s.Err())
	}

	// stdin:false means /dev/null: cat ends at once; input is refused.
	no := false
	s, err = e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "sh", Args: []string{"-c", "cat; echo done"}}, Stdin: &no}))
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); string(r.stdout) != "done\n" {
		t.Fatalf("stdin:false run printed %q", r.stdout)
	}

	// Unknown pid.
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestVersion(t *testing.T) {
	if envd.Version != "0.5.7" {
		t.Fatalf("Version = %q", envd.Version)
	}
}

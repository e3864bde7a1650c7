package envd_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
)

func TestPTY(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	})
	req.Header().Set("Authorization", basicUser("tester"))
	s, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	_, err = e.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 0, Rows: 30}}}))
	wantCode(t, err, connect.CodeInvalidArgument)
	send := func(in string) {
		t.Helper()
		if _, err := e.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
			Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(in)}}})); err != nil {
			t.Fatal(err)
		}
	}
	send("stty size; tty; id -u; exit 7\n")
	var out []byte
	var end *pb.ProcessEvent_EndEvent
	for s.Receive() {
		ev := s.Msg().GetEvent()
		if len(ev.GetData().GetStdout()) > 0 || len(ev.GetData().GetStderr()) > 0 {
			t.Errorf("pty process produced stdout/stderr events")
		}
		out = append(out, ev.GetData().GetPty()...)
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	text := strings.ReplaceAll(string(out), "\r", "")
	for _, want := range []string{"30 100\n", "/dev/pts/", "\n1000\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("pty output %q lacks %q", text, want)
		}
	}
	if end == nil || end.GetExitCode() != 7 {
		t.Errorf("end = %v, err %v", end, s.Err())
	}
}

func TestTimeoutKillsProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(startCmd("echo started; exec sleep 30"))
	req.Header().Set("Keepalive-Ping-Interval", "1")
	start := time.Now()
	// The client sends the context deadline as Connect-Timeout-Ms.
	tctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	s, err := e.proc.Start(tctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	var out []byte
	for s.Receive() {
		out = append(out, s.Msg().GetEvent().GetData().GetStdout()...)
		if ev := s.Msg().GetEvent().GetEnd(); ev != nil {
			end = ev
		}
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Fatalf("timeout took %v", elapsed)
	}
	if string(out) != "started\n" {
		t.Errorf("output %q", out)
	}
	t.Logf("end=%v err=%v", end, s.Err())
	// Either the end event arrived (process killed at the deadline) or the
	// stream ended with deadline_exceeded; both must leave no process.
	if end != nil {
		if end.GetExitCode() != -1 || end.GetStatus() != "signal: killed" || end.GetExited() {
			t.Errorf("end = %v, want signal: killed", end)
		}
	} else if connect.CodeOf(s.Err()) != connect.CodeDeadlineExceeded {
		t.Errorf("no end event and err %v", s.Err())
	}
	list, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Msg.GetProcesses() {
		waitGone(t, e, p.GetPid())
	}
}

func TestBackgroundTimeoutWithoutClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(startCmd("exec sleep 30"))
	// The client sends the context deadline as Connect-Timeout-Ms.
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	s, err := e.proc.Start(sctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	cancel()
	_ = s.Close()
	waitGone(t, e, pid)
}

func TestKeepaliveAndSIGTERM(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(startCmd("exec sleep 30"))
	req.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	if !s.Receive() || s.Msg().GetEvent().GetKeepalive() == nil {
		t.Fatalf("want keepalive, got %v %v", s.Msg(), s.Err())
	}
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for s.Receive() {
		if ev := s.Msg().GetEvent().GetEnd(); ev != nil {
			end = ev
		}
	}
	if end == nil || end.GetStatus() != "signal: terminated" || end.GetExitCode() != -1 {
		t.Fatalf("end = %v, err %v", end, s.Err())
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 1}}, Signal: pb.Signal_SIGNAL_UNSPECIFIED}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: "nope"}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound)
}

func TestStreamInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "cat"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	in := e.proc.StreamInput(ctx)
	msgs := []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("4")}}}}},
		{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(strconv.Itoa(2))}}}}},
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for s.Receive() {
		out = append(out, s.Msg().GetEvent().GetData().GetStdout()...)
	}
	if string(out) != "42" {
		t.Fatalf("out = %q", out)
	}

	// Data before start is refused.
	bad := e.proc.StreamInput(ctx)
	if err := bad.Send(msgs[1]); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = bad.CloseAndReceive()
	wantCode(t, err, connect.CodeInvalidArgument)
}

// A background grandchild that keeps stdout open must not hold the end
// event back for long.
func TestEndDespiteInheritedPipe(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(startCmd("sleep 30 & echo $!")))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := collect(t, s)
	if r.end == nil || r.end.GetExitCode() != 0 || string(r.stdout) == "" {
		t.Fatalf("end %v stdout %q", r.end, r.stdout)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("end event took %v", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill orphan sleep: %v", err)
	}
}

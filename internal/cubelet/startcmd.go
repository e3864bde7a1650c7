package cubelet

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
)

// The start step: a template built with a start command (the E2B
// Template builder's setStartCmd, a Dockerfile's CMD/ENTRYPOINT through
// `e2b template create`) has it started in every sandbox made from it, and
// the create returns only once its ready command exits 0. Both run through
// envd like any process of the sandbox: as the template's default user,
// in its default workdir. The start command is detached from the cubelet
// (envd keeps it after the stream ends) and lives as long as the sandbox.
//
// The start command sees the template's env only, never a create's
// envVars: a warm-pool slot of the template runs it before any create
// arrives (poolstart.go), and a cold create starts envd without the
// create's env vars and hands them over once the ready command passed, so
// both paths behave alike. That is E2B's behaviour too, where the start
// command runs at build time and sandboxes resume from a snapshot of it.

// DefaultStartTimeout bounds the wait for a template's ready command.
const DefaultStartTimeout = 60 * time.Second

// readyPollInterval is the pause between two runs of the ready command.
const readyPollInterval = 200 * time.Millisecond

// startOutputTail is how much of the start command's output an error quotes.
const startOutputTail = 2048

// hasStartCmd: the template has a start command.
func hasStartCmd(t template.Template) bool { return t.Defaults != nil && t.Defaults.StartCmd != "" }

// startNeeded: the template has a start command, and the slot b resumes
// (if any) did not run it already. A slot made ahead of time runs it when
// its stage is stageStarted.
func (b *build) startNeeded() bool {
	return hasStartCmd(b.tmpl) && !b.doneAhead(stepStart)
}

// launchEnvVars are the env vars envd starts with: none of the create's
// when this run starts the template's start command (they are handed over
// after it, see startTemplateCommand).
func (b *build) launchEnvVars() map[string]string {
	if b.startNeeded() {
		return nil
	}
	return b.envVars
}

// startTemplateCommand starts the start command and waits for the ready
// command (none: the start command having started is enough), then gives
// envd the create's env vars.
func (b *build) startTemplateCommand(ctx context.Context) error {
	if err := b.startAndWaitReady(ctx); err != nil {
		return err
	}
	if b.ahead || len(b.envVars) == 0 {
		return nil
	}
	if err := initEnvd(ctx, b.netnsPath(), b.token, envdInit{EnvVars: b.envVars}); err != nil {
		return fmt.Errorf("env vars after the start command: %w", err)
	}
	return nil
}

func (b *build) startAndWaitReady(ctx context.Context) error {
	d := b.tmpl.Defaults
	timeout := b.c.cfg.StartTimeout
	if timeout <= 0 {
		timeout = DefaultStartTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	envd := b.envdProcessClient()
	started, err := envd.start(ctx, d.StartCmd)
	if err != nil {
		return fmt.Errorf("template %s: start command %q: %w", b.tmpl.Name, d.StartCmd, err)
	}
	if d.ReadyCmd == "" {
		return nil
	}
	if b.ahead && b.endTurn != nil {
		// A slot waits for its ready command without a create turn:
		// a slow start command must not hold creates back.
		b.endTurn()
	}
	for {
		code, out, err := envd.run(ctx, d.ReadyCmd)
		if err == nil && code == 0 {
			return nil
		}
		if ended, exit, output := started.finished(); ended {
			return fmt.Errorf("template %s: start command %q exited (%s) before its ready command %q succeeded; its output: %s: %w",
				b.tmpl.Name, d.StartCmd, exit, d.ReadyCmd, output, errdefs.ErrFailedPrecondition)
		}
		select {
		case <-ctx.Done():
			last := fmt.Sprintf("last exit status %d, output %q", code, tail(out, 512))
			if err != nil {
				last = err.Error()
			}
			_, _, output := started.finished()
			return fmt.Errorf("template %s: ready command %q did not succeed within %v (%s); start command %q output: %q: %w",
				b.tmpl.Name, d.ReadyCmd, timeout, last, d.StartCmd, output, errdefs.ErrUnavailable)
		case <-time.After(readyPollInterval):
		}
	}
}

// sandboxEnvd runs processes in a sandbox through its envd.
type sandboxEnvd struct {
	client processconnect.ProcessClient
	token  string
	user   string
}

// envdProcessClient reaches envd of the sandbox being made on its
// loopback, dialled from inside the sandbox's network namespace (as
// personalise does: its address may not take connections from the host
// before its port is mapped), with the sandbox's token, as the template's
// user.
func (b *build) envdProcessClient() sandboxEnvd {
	return newSandboxEnvd(b.netnsPath(), b.token, b.tmpl)
}

// newSandboxEnvd reaches envd in the network namespace pinned at
// netnsPath with token, as tmpl's default user.
func newSandboxEnvd(netnsPath, token string, tmpl template.Template) sandboxEnvd {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) { return dialEnvdInNetns(ctx, netnsPath) }
	hc := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	url := "http://" + envdLoopback
	user := ""
	if tmpl.Defaults != nil {
		user = tmpl.Defaults.User
	}
	return sandboxEnvd{client: processconnect.NewProcessClient(hc, url), token: token, user: user}
}

func (e sandboxEnvd) request(cmd string) *connect.Request[pb.StartRequest] {
	no := false
	r := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}}, Stdin: &no})
	if e.token != "" {
		r.Header().Set("X-Access-Token", e.token)
	}
	if e.user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(e.user+":")))
	}
	return r
}

// startedProcess follows a detached process's events in the background.
type startedProcess struct {
	done   chan struct{}
	exit   string
	output strings.Builder
}

// finished reports whether the process ended, how, and the tail of its
// output.
func (p *startedProcess) finished() (bool, string, string) {
	select {
	case <-p.done:
		return true, p.exit, tail(p.output.String(), startOutputTail)
	default:
		return false, "", ""
	}
}

// start starts cmd and returns once envd reports it started; its events
// are followed until it ends or ctx ends (the process keeps running then:
// envd detaches it from the stream).
func (e sandboxEnvd) start(ctx context.Context, cmd string) (*startedProcess, error) {
	stream, err := e.client.Start(context.WithoutCancel(ctx), e.request(cmd))
	if err != nil {
		return nil, err
	}
	if !stream.Receive() {
		stream.Close()
		return nil, fmt.Errorf("no start event: %w", streamErr(stream.Err()))
	}
	p := &startedProcess{done: make(chan struct{})}
	go func() {
		<-ctx.Done()
		stream.Close() // the wait is over; the process stays
	}()
	go func() {
		defer close(p.done)
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if data := ev.GetData(); data != nil {
				p.output.Write(data.GetStdout())
				p.output.Write(data.GetStderr())
			}
			if end := ev.GetEnd(); end != nil {
				p.exit = end.GetStatus()
				return
			}
		}
		p.exit = "stream closed"
	}()
	return p, nil
}

// run runs cmd to its end and returns its exit code and output.
func (e sandboxEnvd) run(ctx context.Context, cmd string) (int, string, error) {
	stream, err := e.client.Start(ctx, e.request(cmd))
	if err != nil {
		return -1, "", err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if data := ev.GetData(); data != nil {
			out.Write(data.GetStdout())
			out.Write(data.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return int(end.GetExitCode()), out.String(), nil
		}
	}
	return -1, out.String(), fmt.Errorf("ended without an exit status: %w", streamErr(stream.Err()))
}

// streamErr turns a nil stream error into one that says so.
func streamErr(err error) error {
	if err == nil {
		return errors.New("stream closed")
	}
	return err
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

package process

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
)

// endGrace is how long a stream whose deadline passed still waits for the
// end event of the process that the same deadline kills.
const endGrace = 3 * time.Second

// Start runs a command and streams its events. The process outlives the
// stream: a client disconnect detaches, only Connect-Timeout-Ms (the process
// lifetime) or a signal ends it.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	name, err := account.UsernameFromAuthorization(req.Header().Get("Authorization"))
	if err != nil {
		return rpcerr.From(err)
	}
	user, err := s.settings.Lookup(name)
	if err != nil {
		return rpcerr.From(err)
	}
	if req.Msg.GetProcess() == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process is required"))
	}
	sr := spawnRequest{
		config:   req.Msg.GetProcess(),
		tag:      req.Msg.Tag,
		stdin:    req.Msg.Stdin == nil || req.Msg.GetStdin(),
		user:     user,
		lifetime: headerDuration(req.Header(), "Connect-Timeout-Ms", time.Millisecond),
	}
	if req.Msg.Pty != nil {
		sr.pty = req.Msg.GetPty().GetSize()
		if sr.pty == nil {
			sr.pty = &pb.PTY_Size{Cols: 80, Rows: 24}
		}
	}
	p, sub, err := spawn(sr, s.settings.EnvVars(), s.settings.DefaultWorkdir())
	if err != nil {
		return rpcerr.From(err)
	}
	if err := s.add(p); err != nil {
		_ = p.signal(syscall.SIGKILL)
		p.run(func() {})
		return rpcerr.From(err)
	}
	s.logStart(p, user.Name)
	p.run(func() { s.remove(p); s.logEnd(p) })
	return follow(ctx, req.Header(), p, sub, nil, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

// Connect attaches to a running process: start event, the buffered output,
// then live events until the end.
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return rpcerr.From(err)
	}
	sub, past := p.subscribe(true)
	return follow(ctx, req.Header(), p, sub, past, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	})
}

// follow sends the start event, past events and then live events of p until
// its end event, with keepalives while idle.
func follow(ctx context.Context, h http.Header, p *proc, sub *subscriber, past []*pb.ProcessEvent, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	for _, ev := range past {
		if err := send(ev); err != nil {
			return err
		}
		if ev.GetEnd() != nil {
			return nil
		}
	}
	var keepalive <-chan time.Time
	interval := headerDuration(h, "Keepalive-Ping-Interval", time.Second)
	var ticker *time.Ticker
	if interval > 0 {
		ticker = time.NewTicker(interval)
		defer ticker.Stop()
		keepalive = ticker.C
	}
	done := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
			if ticker != nil {
				ticker.Reset(interval)
			}
		case <-keepalive:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-done:
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeCanceled, ctx.Err())
			}
			// The same deadline kills the process: give its end event a moment.
			done = nil
			t := time.NewTimer(endGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("process %d still running after the stream deadline", p.pid))
		}
	}
}

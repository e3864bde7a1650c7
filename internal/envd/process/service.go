// Package process implements envd's process.Process Connect service: it
// starts commands as sandbox users (pipes or a PTY), streams their output to
// any number of attached clients, and keeps a bounded backlog for clients
// that attach later.
package process

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
	"github.com/cube-dev/cube/internal/errdefs"
)

// Service is the process.Process implementation.
type Service struct {
	settings *account.Settings
	log      *slog.Logger // nil: no log

	mu     sync.Mutex
	procs  map[uint32]*proc
	closed bool
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// New returns a Service resolving users and defaults through settings.
func New(settings *account.Settings) *Service {
	return &Service{settings: settings, procs: map[uint32]*proc{}}
}

// Handler returns the mount path and HTTP handler of the service.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return processconnect.NewProcessHandler(s, opts...)
}

// Close kills every running process (and its process group) and waits, up
// to ctx's deadline, until they have been reaped.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.signal(syscall.SIGKILL)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-ctx.Done():
			return fmt.Errorf("wait for processes: %w", ctx.Err())
		}
	}
	return nil
}

func (s *Service) add(p *proc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("envd is shutting down: %w", errdefs.ErrUnavailable)
	}
	s.procs[p.pid] = p
	return nil
}

func (s *Service) remove(p *proc) {
	s.mu.Lock()
	if s.procs[p.pid] == p {
		delete(s.procs, p.pid)
	}
	s.mu.Unlock()
}

// find resolves a selector to a running process.
func (s *Service) find(sel *pb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[v.Pid]; ok {
			return p, nil
		}
		return nil, fmt.Errorf("process with pid %d: %w", v.Pid, errdefs.ErrNotFound)
	case *pb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, fmt.Errorf("process with tag %q: %w", v.Tag, errdefs.ErrNotFound)
	default:
		return nil, fmt.Errorf("process selector needs pid or tag: %w", errdefs.ErrInvalidArgument)
	}
}

// List returns the running processes, ordered by pid.
func (s *Service) List(_ context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	infos := make([]*pb.ProcessInfo, 0, len(s.procs))
	for _, p := range s.procs {
		infos = append(infos, p.info())
	}
	s.mu.Unlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].GetPid() < infos[j].GetPid() })
	return connect.NewResponse(&pb.ListResponse{Processes: infos}), nil
}

// SendSignal delivers SIGTERM or SIGKILL to a process group.
func (s *Service) SendSignal(_ context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if err := p.signal(sig); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// headerSeconds parses a header holding a positive integer number of
// seconds; anything else yields 0.
func headerDuration(h http.Header, key string, unit time.Duration) time.Duration {
	v := h.Get(key)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > int64(365*24*time.Hour/unit) {
		return 0
	}
	return time.Duration(n) * unit
}

package filesystem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
	"github.com/cube-dev/cube/internal/errdefs"
)

const (
	// maxPendingEvents bounds what a polled watcher keeps between polls;
	// older events are dropped first.
	maxPendingEvents = 4096
	// maxPollWatchers bounds the polled watchers alive at once.
	maxPollWatchers = 256
)

// pollWatcher collects events of a watcher until GetWatcherEvents drains them.
type pollWatcher struct {
	w       *watcher
	mu      sync.Mutex
	pending []*pb.FilesystemEvent
	done    chan struct{}
}

func (p *pollWatcher) collect() {
	defer close(p.done)
	for ev := range p.w.events {
		p.mu.Lock()
		if len(p.pending) >= maxPendingEvents {
			p.pending[0] = nil
			p.pending = p.pending[1:]
		}
		p.pending = append(p.pending, ev)
		p.mu.Unlock()
	}
}

func (p *pollWatcher) drain() []*pb.FilesystemEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.pending
	p.pending = nil
	return out
}

func (p *pollWatcher) close() error {
	err := p.w.close()
	<-p.done
	return err
}

// CreateWatcher starts a polled watcher and returns its id.
func (s *Service) CreateWatcher(_ context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	s.mu.Lock()
	full := len(s.watchers) >= maxPollWatchers
	s.mu.Unlock()
	if full {
		return nil, rpcerr.From(fmt.Errorf("%d watchers exist; remove some first: %w", maxPollWatchers, errdefs.ErrResourceExhausted))
	}
	w, err := newWatcher(watchSpec{
		root:         root,
		recursive:    req.Msg.GetRecursive(),
		includeEntry: req.Msg.GetIncludeEntry(),
		allowNetwork: req.Msg.GetAllowNetworkMounts(),
	}, s.names())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	pw := &pollWatcher{w: w, done: make(chan struct{})}
	go pw.collect()
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s.mu.Lock()
	s.watchers[id] = pw
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *Service) pollWatcher(id string) (*pollWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pw, ok := s.watchers[id]
	if !ok {
		return nil, fmt.Errorf("watcher %q: %w", id, errdefs.ErrNotFound)
	}
	return pw, nil
}

// GetWatcherEvents returns and forgets the events collected since the last call.
func (s *Service) GetWatcherEvents(_ context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	pw, err := s.pollWatcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: pw.drain()}), nil
}

// RemoveWatcher stops a polled watcher.
func (s *Service) RemoveWatcher(_ context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	s.mu.Lock()
	pw, ok := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if !ok {
		return nil, rpcerr.From(fmt.Errorf("watcher %q: %w", id, errdefs.ErrNotFound))
	}
	if err := pw.close(); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

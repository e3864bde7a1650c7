package filesystem

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
)

// WatchDir streams filesystem events under a directory until the client
// goes away or the stream deadline passes. The first message is start.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	_, root, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return rpcerr.From(err)
	}
	w, err := newWatcher(watchSpec{
		root:         root,
		recursive:    req.Msg.GetRecursive(),
		includeEntry: req.Msg.GetIncludeEntry(),
		allowNetwork: req.Msg.GetAllowNetworkMounts(),
	}, s.names())
	if err != nil {
		return rpcerr.From(err)
	}
	defer w.close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	var keepalive <-chan time.Time
	if v := req.Header().Get("Keepalive-Ping-Interval"); v != "" {
		if d, err := time.ParseDuration(v + "s"); err == nil && d > 0 {
			t := time.NewTicker(d)
			defer t.Stop()
			keepalive = t.C
		}
	}
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return connect.NewError(connect.CodeInternal, errors.New("watcher stopped"))
			}
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		case <-keepalive:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return rpcerr.From(ctx.Err())
		}
	}
}

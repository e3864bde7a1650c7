package filesystem

import (
	"context"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
)

// Stat describes one entry (not following a final symlink).
func (s *Service) Stat(_ context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	e, err := s.names().entry(path)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

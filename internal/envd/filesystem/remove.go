package filesystem

import (
	"context"
	"os"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
)

// Remove deletes a file, symlink or directory tree; a missing path is
// not_found.
func (s *Service) Remove(_ context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if _, err := os.Lstat(path); err != nil {
		return nil, rpcerr.From(fsError(path, err))
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, rpcerr.From(fsError(path, err))
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

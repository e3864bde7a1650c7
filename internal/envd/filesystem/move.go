package filesystem

import (
	"context"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
)

// Move renames source to destination, creating the destination's parents.
func (s *Service) Move(_ context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	u, src, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	_, dst, err := s.resolve(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, rpcerr.From(fsError(src, err))
	}
	if err := MkdirAllAs(filepath.Dir(dst), u.UID, u.GID); err != nil {
		return nil, rpcerr.From(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, rpcerr.From(fsError(dst, err))
	}
	e, err := s.names().entry(dst)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

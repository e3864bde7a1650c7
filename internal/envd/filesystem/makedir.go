package filesystem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
	"github.com/cube-dev/cube/internal/errdefs"
)

// MakeDir creates a directory and its parents, owned by the user; an
// existing entry is already_exists.
func (s *Service) MakeDir(_ context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if _, err := os.Lstat(path); err == nil {
		return nil, rpcerr.From(fmt.Errorf("%s: %w", path, errdefs.ErrAlreadyExists))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, rpcerr.From(fsError(path, err))
	}
	if err := MkdirAllAs(path, u.UID, u.GID); err != nil {
		return nil, rpcerr.From(err)
	}
	e, err := s.names().entry(path)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

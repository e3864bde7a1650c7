package filesystem

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
	"github.com/cube-dev/cube/internal/errdefs"
)

// maxListEntries bounds one ListDir answer.
const maxListEntries = 100_000

// ListDir lists a directory down to depth levels (0 and 1 both mean only the
// directory's own entries). Symlinked directories are listed but not entered.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, rpcerr.From(fsError(path, err))
	}
	if !fi.IsDir() {
		return nil, rpcerr.From(fmt.Errorf("%s is not a directory: %w", path, errdefs.ErrInvalidArgument))
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	n := s.names()
	var entries []*pb.EntryInfo
	if err := list(ctx, n, path, depth, &entries); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: entries}), nil
}

func list(ctx context.Context, n *names, dir string, depth int, out *[]*pb.EntryInfo) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if err != nil && len(des) == 0 {
		return fsError(dir, err)
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		fi, err := de.Info()
		if err != nil {
			continue // vanished while listing
		}
		if len(*out) >= maxListEntries {
			return fmt.Errorf("more than %d entries; list a smaller depth: %w", maxListEntries, errdefs.ErrResourceExhausted)
		}
		*out = append(*out, n.entryFromInfo(p, fi))
		if depth > 1 && fi.IsDir() {
			err := list(ctx, n, p, depth-1, out)
			if ctx.Err() != nil || errors.Is(err, errdefs.ErrResourceExhausted) {
				return err
			}
			// An unreadable or vanished subdirectory is listed but not entered.
		}
	}
	return nil
}

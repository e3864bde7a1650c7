// Package filesystem implements envd's filesystem.Filesystem Connect
// service: stat, list, make, move and remove entries, and watch directories
// (streaming or polled watchers), with paths resolved per sandbox user.
package filesystem

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/api/gen/envd/filesystem/filesystemconnect"
	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/errdefs"
)

// Service is the filesystem.Filesystem implementation.
type Service struct {
	settings *account.Settings

	mu       sync.Mutex
	watchers map[string]*pollWatcher
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// New returns a Service resolving users through settings.
func New(settings *account.Settings) *Service {
	return &Service{settings: settings, watchers: map[string]*pollWatcher{}}
}

// Handler returns the mount path and HTTP handler of the service.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return filesystemconnect.NewFilesystemHandler(s, opts...)
}

// Close stops every polled watcher.
func (s *Service) Close() error {
	s.mu.Lock()
	ws := s.watchers
	s.watchers = map[string]*pollWatcher{}
	s.mu.Unlock()
	var errs []error
	for _, w := range ws {
		errs = append(errs, w.close())
	}
	return errors.Join(errs...)
}

// resolve returns the request's user and p as an absolute path (relative
// paths resolve against the user's home).
func (s *Service) resolve(h http.Header, p string) (account.User, string, error) {
	name, err := account.UsernameFromAuthorization(h.Get("Authorization"))
	if err != nil {
		return account.User{}, "", err
	}
	u, err := s.settings.Lookup(name)
	if err != nil {
		return account.User{}, "", err
	}
	abs, err := account.ResolvePath(p, u.Home)
	if err != nil {
		return account.User{}, "", err
	}
	return u, abs, nil
}

// names caches uid/gid lookups within one call.
type names struct {
	s      *account.Settings
	users  map[uint32]string
	groups map[uint32]string
}

func (s *Service) names() *names {
	return &names{s: s.settings, users: map[uint32]string{}, groups: map[uint32]string{}}
}

func (n *names) user(uid uint32) string {
	if v, ok := n.users[uid]; ok {
		return v
	}
	v := n.s.UserName(uid)
	n.users[uid] = v
	return v
}

func (n *names) group(gid uint32) string {
	if v, ok := n.groups[gid]; ok {
		return v
	}
	v := n.s.GroupName(gid)
	n.groups[gid] = v
	return v
}

// entry describes path without following a final symlink.
func (n *names) entry(path string) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fsError(path, err)
	}
	return n.entryFromInfo(path, fi), nil
}

func (n *names) entryFromInfo(path string, fi fs.FileInfo) *pb.EntryInfo {
	mode := fi.Mode()
	e := &pb.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(mode.Perm()),
		Permissions:  mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	switch {
	case mode.IsRegular():
		e.Type = pb.FileType_FILE_TYPE_FILE
	case mode.IsDir():
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	case mode&fs.ModeSymlink != 0:
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			target, _ = os.Readlink(path)
		}
		e.SymlinkTarget = &target
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = n.user(st.Uid)
		e.Group = n.group(st.Gid)
	}
	return e
}

// fsError wraps an os error with the path and an errdefs kind.
func fsError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s: a path component is not a directory: %w", path, errdefs.ErrInvalidArgument)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: %w", path, errdefs.ErrPermissionDenied)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s: %w", path, errdefs.ErrAlreadyExists)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%s: name too long: %w", path, errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%s: no space left on device: %w", path, errdefs.ErrResourceExhausted)
	default:
		return fmt.Errorf("%s: %w", path, err)
	}
}

// MkdirAllAs creates dir and missing parents, handing each directory it
// created to uid/gid. It is exported for the /files upload handler.
func MkdirAllAs(dir string, uid, gid uint32) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: not a directory: %w", dir, errdefs.ErrInvalidArgument)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fsError(dir, err)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := MkdirAllAs(parent, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return fsError(dir, err)
	}
	if err := os.Lchown(dir, int(uid), int(gid)); err != nil && !errors.Is(err, fs.ErrPermission) {
		return fsError(dir, err)
	}
	return nil
}

package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ImportDir registers a template called name from a copy of dir. Modes,
// owners, symlinks (copied, never followed), FIFOs and hard links within dir
// are preserved; device nodes and sockets are skipped (the runtime provides
// /dev). The copy is then prepared (see PrepareRootfs).
func (r *Registry) ImportDir(ctx context.Context, name, dir string) (Template, error) {
	src, err := filepath.Abs(dir)
	if err != nil {
		return Template{}, fmt.Errorf("import dir %s: %w", dir, err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Template{}, fmt.Errorf("import dir %s: %w", dir, errdefs.ErrNotFound)
		}
		return Template{}, fmt.Errorf("import dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return Template{}, fmt.Errorf("import dir %s: not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return r.register(ctx, name, func(ctx context.Context, rootfs string) (string, error) {
		if err := copyTree(ctx, src, rootfs); err != nil {
			return "", fmt.Errorf("copy %s: %w", src, err)
		}
		return "dir:" + src, nil
	})
}

type inode struct{ dev, ino uint64 }

// copyTree copies the contents of src into the existing directory dst.
func copyTree(ctx context.Context, src, dst string) error {
	links := map[inode]string{} // first copy of each multiply-linked file
	type dirTime struct {
		path string
		st   *syscall.Stat_t
	}
	var dirs []dirTime
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat info", path)
		}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, 0o700); err != nil {
					return err
				}
			}
			if err := setOwnerMode(target, st); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{target, st})
			return nil
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		case mode.IsRegular():
			key := inode{uint64(st.Dev), st.Ino}
			if st.Nlink > 1 {
				if first, ok := links[key]; ok {
					return os.Link(first, target)
				}
				links[key] = target
			}
			if err := copyFile(path, target); err != nil {
				return err
			}
			if err := setOwnerMode(target, st); err != nil {
				return err
			}
		case mode&fs.ModeNamedPipe != 0:
			if err := unix.Mkfifo(target, 0o600); err != nil {
				return fmt.Errorf("mkfifo %s: %w", target, err)
			}
			if err := setOwnerMode(target, st); err != nil {
				return err
			}
		default: // devices, sockets: skipped
			return nil
		}
		return setTimes(target, st)
	})
	if err != nil {
		return err
	}
	// Directory times last, children first, since creating entries bumps them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := setTimes(dirs[i].path, dirs[i].st); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

// setOwnerMode applies uid/gid and then the full mode (chown clears setuid).
func setOwnerMode(path string, st *syscall.Stat_t) error {
	if err := os.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, path, st.Mode&0o7777, 0); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}

func setTimes(path string, st *syscall.Stat_t) error {
	ts := []unix.Timespec{
		{Sec: st.Atim.Sec, Nsec: st.Atim.Nsec},
		{Sec: st.Mtim.Sec, Nsec: st.Mtim.Nsec},
	}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times %s: %w", path, err)
	}
	return nil
}

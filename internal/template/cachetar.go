package template

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/atomicfile"
)

// writeTarCache writes the tree at rootfs to file as an uncompressed tar,
// atomically (temporary file, fsync, rename). Device nodes and sockets are
// left out; hard links are kept.
func writeTarCache(ctx context.Context, rootfs, file string) (err error) {
	tmp := file + ".tmp-" + randSuffix()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create cache file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := writeTar(ctx, rootfs, bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	atomicfile.SyncDir(filepath.Dir(file))
	return nil
}

// writeTar writes the tree at dir as a tar stream with paths relative to dir
// ("./" for dir itself).
func writeTar(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[inode]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat info", path)
		}
		name := "./" + filepath.ToSlash(rel)
		if rel == "." {
			name = "./"
		}
		var link string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR, unix.S_IFREG, unix.S_IFIFO:
		case unix.S_IFLNK:
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		default:
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name = name + "/"
			if rel == "." {
				hdr.Name = "./"
			}
		}
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if hdr.Typeflag == tar.TypeReg && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				return tw.WriteHeader(hdr)
			}
			links[key] = name
		}
		if err := addXattrRecords(hdr, path); err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		src, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer src.Close()
		n, err := io.Copy(tw, src)
		if err != nil {
			return fmt.Errorf("archive %s: %w", path, err)
		}
		if n != hdr.Size {
			return fmt.Errorf("archive %s: changed size while reading", path)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archive %s: %w", dir, err)
	}
	return tw.Close()
}

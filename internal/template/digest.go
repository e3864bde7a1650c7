package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Digest returns "sha256:<hex>" over a canonical walk of the tree at rootfs:
// entries in lexical path order, each contributing its relative path, type,
// permission bits (incl. setuid/setgid/sticky), uid, gid and then, for
// regular files, the size and the sha256 of the content; for symlinks the
// target; for device nodes the device number. Modification times are not
// included, so the same content imported twice has the same digest.
func Digest(ctx context.Context, rootfs string) (string, error) {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(rootfs, path)
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
		var typ byte
		var extra string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			typ = 'd'
		case unix.S_IFREG:
			typ = 'f'
			sum, err := fileSum(path, buf)
			if err != nil {
				return err
			}
			extra = fmt.Sprintf("%d:%s", st.Size, sum)
		case unix.S_IFLNK:
			typ = 'l'
			if extra, err = os.Readlink(path); err != nil {
				return err
			}
		case unix.S_IFIFO:
			typ = 'p'
		case unix.S_IFCHR, unix.S_IFBLK:
			typ = 'c'
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				typ = 'b'
			}
			extra = fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		default:
			typ = 's'
		}
		fmt.Fprintf(h, "%q %c %o %d %d %q\n", filepath.ToSlash(rel), typ, st.Mode&0o7777, st.Uid, st.Gid, extra)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digest %s: %w", rootfs, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func fileSum(path string, buf []byte) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, buf); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

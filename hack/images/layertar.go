package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// writeTreeTar writes the tree at dir as a layer tar: names relative to dir
// in lexical order, directories with a trailing slash, every time set to
// epoch, numeric owners only, hard links kept (the first name is the file,
// later names link to it). Device nodes and sockets are left out.
func writeTreeTar(ctx context.Context, dir string, w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	tw := tar.NewWriter(bw)
	links := map[[2]uint64]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat info", p)
		}
		var link string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR, unix.S_IFREG, unix.S_IFIFO:
		case unix.S_IFLNK:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = int(st.Uid), int(st.Gid), "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if hdr.Typeflag == tar.TypeReg && st.Nlink > 1 {
			key := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				return tw.WriteHeader(hdr)
			}
			links[key] = hdr.Name
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if n, err := io.Copy(tw, f); err != nil || n != hdr.Size {
			return fmt.Errorf("archive %s: %d of %d bytes: %v", p, n, hdr.Size, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archive %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// gzipTar writes the gzip of the tar in file (no name, no time in the gzip
// header: the same tar gives the same blob).
func gzipTar(w io.Writer, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(w)
	if _, err := io.Copy(zw, bufio.NewReaderSize(f, 1<<20)); err != nil {
		return err
	}
	return zw.Close()
}

// entry is what a layer diff compares of a tar entry. A hard link counts as
// the file it links to.
type entry struct {
	typ      byte
	mode     int64
	uid, gid int
	link     string   // symlink target
	sum      [32]byte // content of a regular file
}

// tarIndex is one pass over a tree tar.
type tarIndex struct {
	entries map[string]entry
	order   []string
	group   map[string]string // every name of a hard-link group -> the group's first name
}

func indexTar(file string) (*tarIndex, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ix := &tarIndex{entries: map[string]entry{}, group: map[string]string{}}
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return ix, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		e := entry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid}
		switch h.Typeflag {
		case tar.TypeSymlink:
			e.link = h.Linkname
		case tar.TypeReg:
			s := sha256.New()
			if _, err := io.Copy(s, tr); err != nil {
				return nil, fmt.Errorf("read %s: %w", file, err)
			}
			copy(e.sum[:], s.Sum(nil))
		case tar.TypeLink:
			target, ok := ix.entries[h.Linkname]
			if !ok {
				return nil, fmt.Errorf("read %s: %s links to %s, not seen before it", file, h.Name, h.Linkname)
			}
			e = target
			ix.group[h.Name], ix.group[h.Linkname] = h.Linkname, h.Linkname
		}
		ix.entries[h.Name] = e
		ix.order = append(ix.order, h.Name)
	}
}

// gzipDiff writes the gzipped layer that turns the tree of the tar in base
// into the tree of the tar in full: every entry that is new or differs
// (type, mode, owner, link target, content), whole hard-link groups when one
// of their names changed, and an OCI whiteout (.wh.<name>) for every name
// base has and full does not (one for a removed directory, not its
// contents).
func gzipDiff(w io.Writer, base, full string) error {
	bix, err := indexTar(base)
	if err != nil {
		return err
	}
	fix, err := indexTar(full)
	if err != nil {
		return err
	}
	emit := map[string]bool{}
	for _, name := range fix.order {
		if b, ok := bix.entries[name]; !ok || b != fix.entries[name] {
			emit[name] = true
			if g, ok := fix.group[name]; ok {
				emit[g] = true
			}
		}
	}
	for name, g := range fix.group { // a changed group is written whole
		if emit[g] {
			emit[name] = true
		}
	}
	gone := map[string]bool{}
	for _, name := range bix.order {
		if _, ok := fix.entries[name]; !ok {
			gone[name] = true
		}
	}
	var removed []string
	for name := range gone {
		if !gone[path.Dir(trimSlash(name))+"/"] { // else the parent's whiteout covers it
			removed = append(removed, name)
		}
	}
	sort.Strings(removed)

	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, name := range removed {
		n := trimSlash(name)
		wh := path.Join(path.Dir(n), ".wh."+path.Base(n))
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: wh, Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	f, err := os.Open(full)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", full, err)
		}
		if !emit[h.Name] {
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func trimSlash(s string) string {
	for len(s) > 1 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

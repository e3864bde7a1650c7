package template

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// paxXattr prefixes the PAX records that carry extended attributes (the
// convention of GNU and star tar, and of OCI layers).
const paxXattr = "SCHILYXATTR."

// carriedXattr reports whether the xattr name travels with a tree.
// security.selinux is left out: it is a label the receiving host's policy
// assigns, and hosts without SELinux refuse it.
func carriedXattr(name string) bool { return name != "security.selinux" }

// readXattrs returns the carried xattrs of path, not following a symlink;
// nil when it has none or the filesystem keeps none.
func readXattrs(path string) (map[string]string, error) {
	names, err := listXattrs(path)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	var out map[string]string
	for _, n := range names {
		if !carriedXattr(n) {
			continue
		}
		v, err := getXattr(path, n)
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read xattr %s of %s: %w", n, path, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[n] = v
	}
	return out, nil
}

func listXattrs(path string) ([]string, error) {
	for {
		sz, err := unix.Llistxattr(path, nil)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		if sz == 0 {
			return nil, nil
		}
		buf := make([]byte, sz)
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		sort.Strings(names)
		return names, nil
	}
}

func getXattr(path, name string) (string, error) {
	for {
		sz, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return "", err
		}
		buf := make([]byte, sz)
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// addXattrRecords puts the carried xattrs of path into hdr's PAX records.
func addXattrRecords(hdr *tar.Header, path string) error {
	xs, err := readXattrs(path)
	if err != nil || len(xs) == 0 {
		return err
	}
	if hdr.PAXRecords == nil {
		hdr.PAXRecords = map[string]string{}
	}
	for k, v := range xs {
		hdr.PAXRecords[paxXattr+k] = v
	}
	return nil
}

// setXattrs applies hdr's SCHILYXATTR records to pfd/base (fd alone when
// base is ""), never following a symlink: the path goes through the
// parent's /proc/self/fd link, already resolved inside the root, and
// lsetxattr does not follow the last component. Namespaces the filesystem
// or LSM refuses (ENOTSUP) are skipped, as containerd does.
func setXattrs(pfd int, base string, hdr *tar.Header) error {
	var keys []string
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxXattr) && carriedXattr(strings.TrimPrefix(k, paxXattr)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		name, val := strings.TrimPrefix(k, paxXattr), []byte(hdr.PAXRecords[k])
		var err error
		if base == "" {
			err = unix.Fsetxattr(pfd, name, val, 0)
		} else {
			err = unix.Lsetxattr("/proc/self/fd/"+strconv.Itoa(pfd)+"/"+base, name, val, 0)
		}
		if err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	return nil
}

// XattrDigest returns "sha256:<hex>" over the extended attributes in the
// tree at rootfs (those a template carries, see WriteTar): entries in
// lexical path order, each xattr as its path, name and value. It returns ""
// for a tree without any, so that templates without xattrs publish nothing
// new. Digest leaves xattrs out (it predates them and recorded digests must
// stay valid); XattrDigest is the check that complements it.
func XattrDigest(ctx context.Context, rootfs string) (string, error) {
	h := sha256.New()
	n := 0
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		switch d.Type() {
		case 0, fs.ModeDir, fs.ModeSymlink, fs.ModeNamedPipe:
		default:
			return nil // not in a template's tar stream either
		}
		xs, err := readXattrs(path)
		if err != nil || len(xs) == 0 {
			return err
		}
		rel, err := filepath.Rel(rootfs, path)
		if err != nil {
			return err
		}
		names := make([]string, 0, len(xs))
		for k := range xs {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Fprintf(h, "%q %q %q\n", filepath.ToSlash(rel), k, xs[k])
			n++
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("xattr digest %s: %w", rootfs, err)
	}
	if n == 0 {
		return "", nil
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

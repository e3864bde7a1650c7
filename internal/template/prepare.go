package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Users every template provides.
const (
	UserName = "user"
	UserUID  = 1000
	UserGID  = 1000
	UserHome = "/home/user"
	RootHome = "/root"
	// EnvdMountPoint is the directory (relative to the rootfs) where the
	// runtime mounts envd.
	EnvdMountPoint = ".cube"
)

// PrepareRootfs makes an imported root filesystem usable as a sandbox
// template: users root (uid 0) and user (uid 1000) exist in etc/passwd,
// etc/group and etc/shadow; /root, /home/user (1000:1000), /tmp (1777),
// /.cube and the mount points proc, sys, dev, run exist; etc/hostname,
// etc/hosts and etc/resolv.conf are regular files (a symlinked resolv.conf is
// replaced). Files are edited directly through an os.Root, so nothing outside
// rootfs can be touched, even by symlinks planted in the image.
func PrepareRootfs(ctx context.Context, rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	defer root.Close()
	steps := []struct {
		what string
		fn   func(*os.Root) error
	}{
		{"directories", prepareDirs},
		{"users", prepareUsers},
		{"network files", prepareNetworkFiles},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.fn(root); err != nil {
			return fmt.Errorf("prepare rootfs %s: %s: %w", rootfs, s.what, err)
		}
	}
	return nil
}

func prepareDirs(root *os.Root) error {
	dirs := []struct {
		name     string
		mode     fs.FileMode
		uid, gid int
		force    bool // enforce mode and owner even when it exists
	}{
		{"etc", 0o755, 0, 0, false},
		{"proc", 0o555, 0, 0, false},
		{"sys", 0o555, 0, 0, false},
		{"dev", 0o755, 0, 0, false},
		{"run", 0o755, 0, 0, false},
		{"root", 0o700, 0, 0, false},
		{"home", 0o755, 0, 0, false},
		{"home/user", 0o755, UserUID, UserGID, true},
		{"tmp", fs.ModeSticky | 0o777, 0, 0, true},
		{EnvdMountPoint, 0o755, 0, 0, true},
	}
	for _, d := range dirs {
		fi, err := root.Lstat(d.name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := root.Mkdir(d.name, 0o700); err != nil {
				return err
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("/%s exists and is not a directory: %w", d.name, errdefs.ErrInvalidArgument)
		case !d.force:
			continue
		}
		if err := root.Lchown(d.name, d.uid, d.gid); err != nil {
			return err
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return err
		}
	}
	return nil
}

func prepareNetworkFiles(root *os.Root) error {
	files := []struct{ name, content string }{
		{"etc/hostname", "cube\n"},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"etc/resolv.conf", "# replaced per sandbox by cube\nnameserver 127.0.0.1\n"},
	}
	for _, f := range files {
		fi, err := root.Lstat(f.name)
		switch {
		case err == nil && fi.Mode().IsRegular():
			continue
		case err == nil && fi.Mode()&fs.ModeSymlink != 0:
			if err := root.Remove(f.name); err != nil {
				return err
			}
		case err == nil:
			return fmt.Errorf("/%s is not a regular file: %w", f.name, errdefs.ErrInvalidArgument)
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if err := writeRootFile(root, f.name, []byte(f.content), 0o644, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

func prepareUsers(root *os.Root) error {
	shell := "/bin/sh"
	if fi, err := root.Stat("bin/bash"); err == nil && fi.Mode().IsRegular() {
		shell = "/bin/bash"
	} else if fi, err := root.Stat("usr/bin/bash"); err == nil && fi.Mode().IsRegular() {
		shell = "/bin/bash"
	}
	// An empty "last change" field keeps the rootfs (and its digest) the
	// same whatever day it was built; it disables password aging.
	days := ""

	passwd := []dbEntry{
		{"root", []string{"root", "x", "0", "0", "root", RootHome, shell}, func(f []string) []string {
			f[2], f[3], f[5] = "0", "0", RootHome
			if f[6] == "" {
				f[6] = shell
			}
			return f
		}},
		{UserName, []string{UserName, "x", itoa(UserUID), itoa(UserGID), "", UserHome, shell}, func(f []string) []string {
			f[2], f[3], f[5], f[6] = itoa(UserUID), itoa(UserGID), UserHome, shell
			return f
		}},
	}
	group := []dbEntry{
		{"root", []string{"root", "x", "0", ""}, func(f []string) []string { f[2] = "0"; return f }},
		{UserName, []string{UserName, "x", itoa(UserGID), ""}, func(f []string) []string { f[2] = itoa(UserGID); return f }},
	}
	shadow := []dbEntry{
		{"root", []string{"root", "*", days, "0", "99999", "7", "", "", ""}, nil},
		{UserName, []string{UserName, "*", days, "0", "99999", "7", "", "", ""}, nil},
	}
	gshadow := []dbEntry{
		{"root", []string{"root", "*", "", ""}, nil},
		{UserName, []string{UserName, "!", "", ""}, nil},
	}
	if err := editDB(root, "etc/passwd", 7, passwd, 0o644, 0, true); err != nil {
		return err
	}
	if err := editDB(root, "etc/group", 4, group, 0o644, 0, true); err != nil {
		return err
	}
	shadowGID := lookupGroup(root, "shadow")
	if err := editDB(root, "etc/shadow", 9, shadow, 0o640, shadowGID, true); err != nil {
		return err
	}
	return editDB(root, "etc/gshadow", 4, gshadow, 0o640, shadowGID, false)
}

// dbEntry describes one line of a colon-separated user database: its name,
// the fields to add when missing, and a fixup applied when present.
type dbEntry struct {
	name  string
	add   []string
	fixup func([]string) []string
}

// editDB ensures entries exist in a colon-separated file such as etc/passwd.
// Existing lines are kept byte for byte unless a fixup changes them. A new
// file is created (with mode and group gid) only when create is set.
func editDB(root *os.Root, name string, nfields int, entries []dbEntry, mode fs.FileMode, gid int, create bool) error {
	data, err := root.ReadFile(name)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if !exists && !create {
		return nil
	}
	if exists {
		fi, err := root.Lstat(name)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("/%s is not a regular file: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	text := strings.TrimSuffix(string(data), "\n")
	var lines []string
	if text != "" {
		lines = strings.Split(text, "\n")
	}
	changed := !exists
	for _, e := range entries {
		found := false
		for i, l := range lines {
			f := strings.Split(l, ":")
			if f[0] != e.name {
				continue
			}
			found = true
			if e.fixup == nil {
				break
			}
			for len(f) < nfields {
				f = append(f, "")
			}
			if nl := strings.Join(e.fixup(f), ":"); nl != l {
				lines[i], changed = nl, true
			}
			break
		}
		if !found {
			lines = append(lines, strings.Join(e.add, ":"))
			changed = true
		}
	}
	if !changed {
		return nil
	}
	out := []byte(strings.Join(lines, "\n") + "\n")
	if exists {
		// Truncating keeps the file's mode and owner.
		return root.WriteFile(name, out, mode)
	}
	return writeRootFile(root, name, out, mode, 0, gid)
}

// writeRootFile creates name (which must not exist) with exact mode and owner.
func writeRootFile(root *os.Root, name string, data []byte, mode fs.FileMode, uid, gid int) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chown(uid, gid); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// lookupGroup returns the gid of group name in etc/group, or 0.
func lookupGroup(root *os.Root, name string) int {
	data, err := root.ReadFile("etc/group")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ":")
		if len(f) >= 3 && f[0] == name {
			if gid, err := strconv.Atoi(f[2]); err == nil {
				return gid
			}
		}
	}
	return 0
}

func itoa(i int) string { return strconv.Itoa(i) }

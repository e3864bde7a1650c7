// Package atomicfile replaces files so that readers see the old content or
// the new, never a part, and (Write) the new content is on disk before the
// rename.
package atomicfile

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// Write writes data to path through a temporary file in the same
// directory (mode, fsync, then rename). The directory entry itself is made
// durable only by SyncDir.
func Write(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, true)
}

// Replace is Write without the fsync, for files that only matter while
// the machine keeps running (a sandbox's spec for its shim, a live
// process's address): readers see the old content or the new, also after
// the writer was killed, but a power loss may leave the file empty or
// missing. An fsync costs a create several milliseconds on a busy disk.
func Replace(path string, data []byte, mode os.FileMode) error {
	return write(path, data, mode, false)
}

func write(path string, data []byte, mode os.FileMode, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// WriteJSON writes v as indented JSON plus a newline with Write.
func WriteJSON(path string, v any, mode os.FileMode) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return Write(path, append(b, '\n'), mode)
}

// ReplaceJSON is WriteJSON with Replace (no fsync).
func ReplaceJSON(path string, v any, mode os.FileMode) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return Replace(path, append(b, '\n'), mode)
}

// SyncFile fsyncs the file at path, best effort: after Replace, once
// nobody waits for it.
func SyncFile(path string) {
	if f, err := os.Open(path); err == nil {
		_ = f.Sync()
		_ = f.Close()
	}
}

// SyncDir fsyncs dir, so a rename in it survives a power loss. Best effort:
// some filesystems refuse to sync a directory.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

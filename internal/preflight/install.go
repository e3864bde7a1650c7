package preflight

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/errdefs"
)

// ManifestName is the file InstallArtifacts writes last in the destination.
const ManifestName = "MANIFEST.json"

// Artifact is one installed file.
type Artifact struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Mode   uint32 `json:"mode"`
}

// InstallArtifacts copies the regular files of src (envd, runtime
// artifacts) into dst on the host. Each changed file is written to a
// temporary name in its target directory, synced and renamed over the old
// one, so a reader (cubelet injecting envd) sees the old or the new file,
// never a partial one; a process or bind mount holding the old file keeps
// its inode. Unchanged files are left alone. The manifest is written last,
// the same way. It returns the installed artifacts and how many changed.
func InstallArtifacts(src, dst string) ([]Artifact, int, error) {
	var arts []Artifact
	changed := 0
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel == ManifestName {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		sum, err := fileSHA256(p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if old, err := fileSHA256(target); err != nil || old != sum {
			if err := atomicCopy(p, target, info.Mode().Perm()); err != nil {
				return err
			}
			changed++
		} else if err := os.Chmod(target, info.Mode().Perm()); err != nil {
			return err
		}
		arts = append(arts, Artifact{Path: rel, SHA256: sum, Mode: uint32(info.Mode().Perm())})
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("install artifacts from %s: %w: %w", src, err, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("install artifacts from %s: %w", src, err)
	}
	if len(arts) == 0 {
		return nil, 0, fmt.Errorf("install artifacts: %s holds no files: %w", src, errdefs.ErrInvalidArgument)
	}
	sort.Slice(arts, func(i, j int) bool { return arts[i].Path < arts[j].Path })
	b, err := json.MarshalIndent(arts, "", "  ")
	if err != nil {
		return nil, 0, err
	}
	if err := atomicWrite(filepath.Join(dst, ManifestName), append(b, '\n'), 0o644); err != nil {
		return nil, 0, fmt.Errorf("install artifacts: %w", err)
	}
	return arts, changed, nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func atomicCopy(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicWriteFrom(dst, in, mode)
}

func atomicWrite(dst string, b []byte, mode fs.FileMode) error {
	return atomicWriteFrom(dst, bytes.NewReader(b), mode)
}

func atomicWriteFrom(dst string, r io.Reader, mode fs.FileMode) (err error) {
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = io.Copy(tmp, r); err != nil {
		return err
	}
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	atomicfile.SyncDir(dir)
	return nil
}

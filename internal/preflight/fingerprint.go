package preflight

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/errdefs"
)

// FingerprintSchema is the schema version of fingerprint files; readers
// refuse newer ones.
const FingerprintSchema = 1

// Fingerprint records that a node was prepared for one prep generation and
// what the checks saw. The cube-node init container waits for it.
type Fingerprint struct {
	Schema     int       `json:"schema"`
	Generation int       `json:"generation"`
	Node       string    `json:"node,omitempty"`
	Version    string    `json:"cubeVersion"`
	Kernel     string    `json:"kernel"`
	Runtime    string    `json:"runtime"`
	CreatedAt  time.Time `json:"createdAt"`
	// ReportDigest is the SHA-256 of the JSON report the prep passed.
	ReportDigest string   `json:"reportDigest"`
	Warnings     []Result `json:"warnings,omitempty"`
}

// NewFingerprint builds the fingerprint of a passed report.
func NewFingerprint(gen int, node, version, kernel string, rep Report, now time.Time) (Fingerprint, error) {
	if !rep.Passed {
		return Fingerprint{}, fmt.Errorf("fingerprint: preflight did not pass: %w", errdefs.ErrFailedPrecondition)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return Fingerprint{}, fmt.Errorf("fingerprint: %w", err)
	}
	sum := sha256.Sum256(b)
	fp := Fingerprint{Schema: FingerprintSchema, Generation: gen, Node: node, Version: version,
		Kernel: kernel, Runtime: rep.Runtime, CreatedAt: now.UTC(), ReportDigest: hex.EncodeToString(sum[:])}
	for _, r := range rep.Results {
		if r.Status == StatusWarn {
			fp.Warnings = append(fp.Warnings, r)
		}
	}
	return fp, nil
}

// FingerprintPath is <dir>/<generation>.fingerprint.
func FingerprintPath(dir string, gen int) string {
	return filepath.Join(dir, strconv.Itoa(gen)+".fingerprint")
}

// WriteFingerprint writes fp to FingerprintPath atomically: a temporary
// file in the same directory, fsync, rename, fsync of the directory.
func WriteFingerprint(dir string, fp Fingerprint) error {
	if fp.Generation < 1 {
		return fmt.Errorf("fingerprint generation %d: want >= 1: %w", fp.Generation, errdefs.ErrInvalidArgument)
	}
	if err := writeJSONAtomic(dir, FingerprintPath(dir, fp.Generation), fp); err != nil {
		return fmt.Errorf("write fingerprint: %w", err)
	}
	return nil
}

// writeJSONAtomic writes v as indented JSON to path (inside dir, which it
// creates), world-readable, and makes the rename durable.
func writeJSONAtomic(dir, path string, v any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := atomicfile.WriteJSON(path, v, 0o644); err != nil {
		return err
	}
	atomicfile.SyncDir(dir)
	return nil
}

// ReadFingerprint reads the fingerprint of generation gen. A missing file
// is ErrNotFound; a corrupt one, another generation or a newer schema is
// ErrFailedPrecondition.
func ReadFingerprint(dir string, gen int) (Fingerprint, error) {
	path := FingerprintPath(dir, gen)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Fingerprint{}, fmt.Errorf("fingerprint %s: %w", path, errdefs.ErrNotFound)
	}
	if err != nil {
		return Fingerprint{}, fmt.Errorf("fingerprint: %w", err)
	}
	var fp Fingerprint
	if err := json.Unmarshal(b, &fp); err != nil {
		return Fingerprint{}, fmt.Errorf("fingerprint %s: %v: %w", path, err, errdefs.ErrFailedPrecondition)
	}
	switch {
	case fp.Schema > FingerprintSchema:
		return Fingerprint{}, fmt.Errorf("fingerprint %s has schema %d, newer than %d: upgrade cube: %w",
			path, fp.Schema, FingerprintSchema, errdefs.ErrFailedPrecondition)
	case fp.Generation != gen:
		return Fingerprint{}, fmt.Errorf("fingerprint %s is for generation %d, want %d: %w",
			path, fp.Generation, gen, errdefs.ErrFailedPrecondition)
	}
	return fp, nil
}

// ReadGeneration reads a prep generation (a positive integer) from a file,
// such as the key of a mounted ConfigMap.
func ReadGeneration(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("prep generation: %w", err)
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("prep generation %q in %s: want a positive integer: %w", s, path, errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// WaitFingerprint polls until the fingerprint of gen exists and is valid,
// or ctx ends. A corrupt or mismatching file keeps it waiting (the
// bootstrap rewrites it); the last problem is returned on timeout.
func WaitFingerprint(ctx context.Context, dir string, gen int, every time.Duration) (Fingerprint, error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		fp, err := ReadFingerprint(dir, gen)
		if err == nil {
			return fp, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return Fingerprint{}, err
		}
		select {
		case <-ctx.Done():
			return Fingerprint{}, fmt.Errorf("waiting for node prep generation %d (is cube-node-bootstrap running on this node?): %w: %w",
				gen, err, errdefs.ErrUnavailable)
		case <-t.C:
		}
	}
}

package preflight

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Failure records that the checks of one prep generation failed on a node:
// <dir>/<generation>.failed, next to the fingerprints. `cube prep` writes it
// when preflight fails and removes it when the generation passes, so that a
// running cubelet can report why its node is not prepared. Nothing waits
// for it: cube-node's wait-prep only ever accepts a fingerprint.
type Failure struct {
	Schema     int       `json:"schema"`
	Generation int       `json:"generation"`
	Node       string    `json:"node,omitempty"`
	Version    string    `json:"cubeVersion"`
	CreatedAt  time.Time `json:"createdAt"`
	Failed     []Result  `json:"failed"`
}

// FailurePath is <dir>/<generation>.failed.
func FailurePath(dir string, gen int) string {
	return filepath.Join(dir, strconv.Itoa(gen)+".failed")
}

// NewFailure builds the failure record of a report that did not pass.
func NewFailure(gen int, node, version string, rep Report, now time.Time) Failure {
	return Failure{Schema: FingerprintSchema, Generation: gen, Node: node, Version: version,
		CreatedAt: now.UTC(), Failed: rep.Failed()}
}

// WriteFailure writes f to FailurePath atomically.
func WriteFailure(dir string, f Failure) error {
	if f.Generation < 1 {
		return fmt.Errorf("prep failure generation %d: want >= 1: %w", f.Generation, errdefs.ErrInvalidArgument)
	}
	if err := writeJSONAtomic(dir, FailurePath(dir, f.Generation), f); err != nil {
		return fmt.Errorf("write prep failure: %w", err)
	}
	return nil
}

// ClearFailure removes the failure record of gen, if any.
func ClearFailure(dir string, gen int) error {
	if err := os.Remove(FailurePath(dir, gen)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("clear prep failure: %w", err)
	}
	return nil
}

// PrepState summarises a node's prep directory.
type PrepState string

// Prep states.
const (
	PrepPassed  PrepState = "passed"  // the newest record is a fingerprint
	PrepFailed  PrepState = "failed"  // the newest record is a failure
	PrepNone    PrepState = "none"    // no record: the node runs without cube prep (e.g. cube up)
	PrepInvalid PrepState = "invalid" // the newest record cannot be read
)

// PrepStatus is the newest prep record of a directory.
type PrepStatus struct {
	State      PrepState
	Generation int
	At         time.Time // when its checks ran
	Failed     []string  // "name: message" of each failing check
	Warnings   int
	Detail     string // the directory, or why the record is invalid
}

// LatestPrep reports the newest prep record in dir: the one whose checks
// ran last, whatever its generation, so that lowering
// cubeNodeBootstrap.prepGeneration (a rollback re-runs the bootstrap) is
// reported as well as raising it. An unreadable record counts at its
// modification time.
func LatestPrep(dir string) PrepStatus {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return PrepStatus{State: PrepNone, Detail: "no prep directory " + dir}
	}
	if err != nil {
		return PrepStatus{State: PrepInvalid, Detail: fmt.Sprintf("prep directory: %v", err)}
	}
	var best *PrepStatus
	for _, e := range ents {
		st := readRecord(dir, e)
		if st != nil && (best == nil || newer(*st, *best)) {
			best = st
		}
	}
	if best == nil {
		return PrepStatus{State: PrepNone, Detail: "no prep record in " + dir}
	}
	return *best
}

// newer orders records by the time their checks ran, then by generation.
func newer(a, b PrepStatus) bool {
	if !a.At.Equal(b.At) {
		return a.At.After(b.At)
	}
	return a.Generation > b.Generation
}

// readRecord reads one directory entry as a prep record; nil when it is
// not one (temporary files, other names).
func readRecord(dir string, e fs.DirEntry) *PrepStatus {
	base, ext := splitRecordName(e.Name())
	gen, err := strconv.Atoi(base)
	if ext == "" || err != nil || gen < 1 || !e.Type().IsRegular() {
		return nil
	}
	var st *PrepStatus
	if ext == ".fingerprint" {
		st = readPassed(dir, gen)
	} else {
		st = readFailed(dir, gen)
	}
	if st.State == PrepInvalid {
		if info, err := e.Info(); err == nil {
			st.At = info.ModTime().UTC()
		}
	}
	return st
}

// splitRecordName splits "3.fingerprint" into "3" and ".fingerprint"; ext
// is empty for names that are not prep records.
func splitRecordName(name string) (base, ext string) {
	for _, x := range []string{".fingerprint", ".failed"} {
		if b, ok := strings.CutSuffix(name, x); ok {
			return b, x
		}
	}
	return name, ""
}

func readPassed(dir string, gen int) *PrepStatus {
	fp, err := ReadFingerprint(dir, gen)
	if err != nil {
		return &PrepStatus{State: PrepInvalid, Generation: gen, Detail: err.Error()}
	}
	return &PrepStatus{State: PrepPassed, Generation: gen, At: fp.CreatedAt, Warnings: len(fp.Warnings),
		Detail: FingerprintPath(dir, gen)}
}

func readFailed(dir string, gen int) *PrepStatus {
	path := FailurePath(dir, gen)
	invalid := func(err error) *PrepStatus {
		return &PrepStatus{State: PrepInvalid, Generation: gen, Detail: fmt.Sprintf("prep failure %s: %v", path, err)}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return invalid(err)
	}
	var f Failure
	if err := json.Unmarshal(b, &f); err != nil {
		return invalid(err)
	}
	if f.Schema > FingerprintSchema || f.Generation != gen {
		return invalid(fmt.Errorf("schema %d, generation %d: not a record of generation %d this cube reads", f.Schema, f.Generation, gen))
	}
	st := &PrepStatus{State: PrepFailed, Generation: gen, At: f.CreatedAt, Detail: path}
	for _, r := range f.Failed {
		st.Failed = append(st.Failed, r.Name+": "+r.Message)
	}
	return st
}

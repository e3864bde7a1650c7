package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/version"
)

// Files in a sandbox state dir. The records and the API types below are
// this package's: the supervisor writes shim.json and exit.json and serves
// State; the agent's side (package shim's Client, nsrt.Sandbox, the
// cubelet) reads them by these names, with no aliases.
const (
	InfoFile   = "shim.json" // Info, written once the sandbox is ready
	ExitFile   = "exit.json" // ExitStatus, written when init has exited
	SocketFile = "shim.sock" // the shim's HTTP API
	LogFile    = "shim.log"  // the shim's own stderr (slog JSON)
)

// SchemaVersion is the version of the records below; readers refuse newer ones.
const SchemaVersion = 1

// Version is the supervisor's software version, reported in Info and State
// (and by `cube node doctor` for every live sandbox): Cube's version, set at
// link time like every Cube binary's (-X .../internal/version.Version=...).
var Version = version.Version

// Info is the supervisor's address record (shim.json; the file keeps the
// name it had when the shim itself served the API).
type Info struct {
	Schema    int       `json:"schema"`
	PID       int       `json:"pid"`
	InitPID   int       `json:"initPid"`
	Version   string    `json:"version"`
	Socket    string    `json:"socket"`
	StartedAt time.Time `json:"startedAt"`
}

// State is the live state of a sandbox as its supervisor serves it (GET
// /state), and the one type for it: shim.Client and nsrt.Sandbox return
// it. The lifecycle of a sandbox's records (nodestore's creating, running,
// deleting, pooled; the control plane's store states) is another thing.
type State struct {
	ShimPID   int       `json:"shimPid"`
	InitPID   int       `json:"initPid"`
	Running   bool      `json:"running"`
	Frozen    bool      `json:"frozen"`
	ExitCode  int       `json:"exitCode"`
	Signal    string    `json:"signal,omitempty"`
	StartedAt time.Time `json:"startedAt"`
	ExitedAt  time.Time `json:"exitedAt,omitzero"`
	Version   string    `json:"version"`
}

// StatusFD is the fd of a starting shim's status pipe, on which the shim
// and then the supervisor report to the agent (see Report).
const StatusFD = 3

// ErrorBody is the shim API's answer to a failed request, with the status
// errdefs.HTTPStatus gives the error.
type ErrorBody struct {
	Error string `json:"error"`
}

// Report is one line on a starting shim's status pipe (StatusFD): first a
// "hello" with the shim's pid, then "done" with the outcome.
type Report struct {
	Stage   string `json:"stage"`
	PID     int    `json:"pid,omitempty"`
	InitPID int    `json:"initPid,omitempty"`
	Error   string `json:"error,omitempty"`
	Code    int    `json:"code,omitempty"` // errdefs.HTTPStatus of Error
}

// ExitStatus records how a sandbox's init ended (exit.json).
type ExitStatus struct {
	Schema   int       `json:"schema"`
	ExitCode int       `json:"exitCode"` // -1 when killed by a signal
	Signal   string    `json:"signal,omitempty"`
	ExitedAt time.Time `json:"exitedAt"`
}

// ReadInfo reads shim.json from stateDir: ErrNotFound when there is none,
// ErrFailedPrecondition when it was written by a newer schema.
func ReadInfo(stateDir string) (Info, error) {
	var i Info
	err := readRecord(filepath.Join(stateDir, InfoFile), &i, func() int { return i.Schema })
	return i, err
}

// ReadExit reads exit.json from stateDir (ErrNotFound when init has not exited).
func ReadExit(stateDir string) (ExitStatus, error) {
	var e ExitStatus
	err := readRecord(filepath.Join(stateDir, ExitFile), &e, func() int { return e.Schema })
	return e, err
}

func readRecord(path string, v any, schema func() int) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", path, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s: %w: %w", path, errdefs.ErrInvalidArgument, err)
	}
	if s := schema(); s > SchemaVersion {
		return fmt.Errorf("%s has schema %d, this shim understands up to %d; upgrade cube: %w", path, s, SchemaVersion, errdefs.ErrFailedPrecondition)
	}
	return nil
}

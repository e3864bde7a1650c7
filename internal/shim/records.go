package shim

import "github.com/cube-dev/cube/internal/supervisor"

// The records and files a shim keeps in its sandbox's state dir are the
// supervisor's (see package supervisor); these names keep the agent's
// side readable.
const (
	InfoFile      = supervisor.InfoFile
	ExitFile      = supervisor.ExitFile
	SocketFile    = supervisor.SocketFile
	LogFile       = supervisor.LogFile
	SchemaVersion = supervisor.SchemaVersion
)

type (
	Info       = supervisor.Info
	ExitStatus = supervisor.ExitStatus
	State      = supervisor.State
)

// ReadInfo reads shim.json from stateDir (see supervisor.ReadInfo).
func ReadInfo(stateDir string) (Info, error) { return supervisor.ReadInfo(stateDir) }

// ReadExit reads exit.json from stateDir (see supervisor.ReadExit).
func ReadExit(stateDir string) (ExitStatus, error) { return supervisor.ReadExit(stateDir) }

package envd

import (
	"os"
	"runtime"
)

// StartupProcsEnv is what a node adds to envd's environment to start it on
// one P: the Go runtime reads GOMAXPROCS before main, and with a second P
// every goroutine envd starts while starting (the signal loop, the server,
// the first connections) wakes or creates another thread, ~0.5 ms of CPU
// per start on a 2-core VM with no gain in latency. The marker says the
// setting is for the start only: envd removes both variables from its
// environment at once, and goes back to the runtime's default GOMAXPROCS
// (cgroup-aware, updated) once it has served its first requests
// (restoreProcs). A GOMAXPROCS without the marker is left alone.
var StartupProcsEnv = []string{"GOMAXPROCS=1", startupProcsMarker + "=1"}

const startupProcsMarker = "CUBE_ENVD_STARTUP_PROCS"

// startupProcs removes StartupProcsEnv from the environment and returns the
// function that restores the default GOMAXPROCS, or nil when envd was not
// started with it.
func startupProcs() (restore func()) {
	if os.Getenv(startupProcsMarker) != "1" {
		return nil
	}
	_ = os.Unsetenv(startupProcsMarker)
	_ = os.Unsetenv("GOMAXPROCS")
	return runtime.SetDefaultGOMAXPROCS
}

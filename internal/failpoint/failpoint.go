// Package failpoint lets tests crash or fail the cubelet at named steps of
// create and destroy. It is off unless the CUBE_FAILPOINTS environment
// variable is set (never in production):
//
//	CUBE_FAILPOINTS="create/after-network=kill,destroy/after-kill=error"
//
// Actions: "kill" sends SIGKILL to the current process (a crash with no
// cleanup), "error" makes Hit return an error.
package failpoint

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
)

// EnvVar names the environment variable that enables failpoints.
const EnvVar = "CUBE_FAILPOINTS"

var (
	once    sync.Once
	actions map[string]string
)

func load() {
	actions = map[string]string{}
	for _, kv := range strings.Split(os.Getenv(EnvVar), ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && name != "" {
			actions[name] = action
		}
	}
}

// Hit evaluates the failpoint name: it returns nil when the failpoint is not
// enabled, an error for "error", and never returns for "kill".
func Hit(name string) error {
	once.Do(load)
	switch actions[name] {
	case "":
		return nil
	case "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; wait for it to land.
	default:
		return fmt.Errorf("failpoint %s triggered", name)
	}
}

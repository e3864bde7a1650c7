package cli

import (
	"github.com/cube-dev/cube/internal/nsrt"
)

// RunInternal handles the subcommands Cube starts itself (never users):
// `cube shim` (per-sandbox supervisor) and `cube sandbox-init` (runs inside
// a new sandbox's namespaces). They must run before any signal handling or
// other process-wide setup, so main calls this first.
func RunInternal(args []string) (code int, handled bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "shim":
		return nsrt.ShimMain(args[1:]), true
	case "sandbox-init":
		return nsrt.InitMain(args[1:]), true
	}
	return 0, false
}

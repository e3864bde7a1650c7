package nsrt

import "github.com/cube-dev/cube/internal/supervisor"

// Dispatch runs the subcommands the runtime starts itself, `shim`,
// `sandbox-init` and `supervise` (see ShimMain, InitMain, supervisor.Main),
// for any binary that carries the runtime (cube, cube-shim). It reports
// false for anything else.
func Dispatch(args []string) (code int, handled bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "shim":
		return ShimMain(args[1:]), true
	case InitCommand:
		return InitMain(args[1:]), true
	case supervisor.Command:
		return supervisor.Main(args[1:]), true
	}
	return 0, false
}

package nsrt

// Dispatch runs the subcommands the runtime starts itself, `shim` and
// `sandbox-init` (see ShimMain, InitMain), for any binary that carries the
// runtime (cube, cube-shim). It reports false for anything else.
func Dispatch(args []string) (code int, handled bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "shim":
		return ShimMain(args[1:]), true
	case InitCommand:
		return InitMain(args[1:]), true
	}
	return 0, false
}

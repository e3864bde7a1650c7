package cli

import "github.com/cube-dev/cube/internal/nsrt"

// RunInternal handles the subcommands Cube starts itself (never users):
// `cube shim` (starts a sandbox), `cube sandbox-init` (runs inside a new
// sandbox's namespaces) and `cube supervise` (the per-sandbox supervisor,
// where cube-supervisor is not installed). They must run before any signal
// handling or other process-wide setup, so main calls this first.
func RunInternal(args []string) (code int, handled bool) { return nsrt.Dispatch(args) }

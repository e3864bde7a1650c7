package cli

import (
	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/sandboxlog"
)

// addSandboxLogFlags declares the bounds of the sandbox logs a node keeps
// (docs/observability.md, "Sandbox logs").
func addSandboxLogFlags(fs *pflag.FlagSet, c *cubelet.LogConfig) {
	fs.DurationVar(&c.Retention, "sandbox-log-retention", sandboxlog.DefaultRetention,
		"how long a sandbox's logs (e2b sandbox logs ID) are kept after it ended")
	bindEnv(fs, "sandbox-log-retention", "CUBE_SANDBOX_LOG_RETENTION")
	fs.Int64Var(&c.MaxBytes, "sandbox-log-max-bytes", sandboxlog.DefaultMaxBytes,
		"bytes of log kept per sandbox; older lines are dropped")
	bindEnv(fs, "sandbox-log-max-bytes", "CUBE_SANDBOX_LOG_MAX_BYTES")
	fs.Int64Var(&c.MaxEndedBytes, "sandbox-log-ended-max-bytes", sandboxlog.DefaultMaxEndedBytes,
		"bytes of the logs of ended sandboxes kept on the node; the oldest go first")
	bindEnv(fs, "sandbox-log-ended-max-bytes", "CUBE_SANDBOX_LOG_ENDED_MAX_BYTES")
}

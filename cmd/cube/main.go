// Command cube is Cube's multi-call binary: all-in-one (`cube up`), the
// server and cubelet roles, the per-sandbox shim, and operator tools.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/cube-dev/cube/internal/cli"
)

func main() {
	if code, ok := cli.RunInternal(os.Args[1:]); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

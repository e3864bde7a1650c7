// Command kubelocal runs a single-node Kubernetes cluster for Cube on this
// machine, without Docker and without a registry (make kube-up / kube-down;
// docs/kubernetes/local-cluster.md):
//
//	kubelocal up     build/reuse the binaries, start the cluster, load Cube's
//	                 images, install the chart, wait for the Cube node, print
//	                 the exports (also written to $CUBE_KUBE_DIR/env)
//	kubelocal down   remove all of it and restore the host; idempotent
//
// Every setting has an environment default (config.go).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: kubelocal up|down")
		os.Exit(2)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := loadConfig()
	if err == nil {
		if os.Args[1] == "up" {
			err = up(ctx, cfg)
		} else {
			err = down(ctx, cfg)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelocal %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

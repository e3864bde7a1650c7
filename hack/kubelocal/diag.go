package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// diagnose prints what helps to see why kube-up failed: the tail of every
// component's log, the Pods and recent events, and the cube-node Pod's
// description and logs (current and previous containers).
func diagnose(ctx context.Context, c *Config) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	w := os.Stderr
	fmt.Fprintln(w, "\n===== kubelocal diagnostics =====")
	logs, _ := filepath.Glob(c.p("logs", "*.log"))
	for _, l := range logs {
		fmt.Fprintf(w, "\n--- %s (last 15 lines)\n%s\n", l, tail(l, 15))
	}
	if _, ok := readPid(c, "kube-apiserver"); !ok {
		return
	}
	show := func(title string, args ...string) {
		out, err := kubectl(ctx, c, args...)
		if err != nil {
			out += "\n" + err.Error()
		}
		fmt.Fprintf(w, "\n--- %s\n%s\n", title, strings.TrimRight(out, "\n"))
	}
	show("pods", "get", "pods", "-A", "-o", "wide")
	show("events", "get", "events", "-A", "--sort-by=.lastTimestamp")
	sel := "app.kubernetes.io/component=node"
	show("cube-node Pods", "-n", c.Namespace, "describe", "pod", "-l", sel)
	show("cube-node logs", "-n", c.Namespace, "logs", "-l", sel, "--all-containers", "--tail=60", "--prefix")
	show("cube-node logs (previous containers)", "-n", c.Namespace, "logs", "-l", sel, "--all-containers", "--tail=30", "--prefix", "--previous")
	show("cube-node-bootstrap logs", "-n", c.Namespace, "logs", "-l", "app.kubernetes.io/component=node-bootstrap", "--all-containers", "--tail=30", "--prefix")
	show("cube-server logs", "-n", c.Namespace, "logs", "-l", "app.kubernetes.io/component=server", "--all-containers", "--tail=30", "--prefix")
	fmt.Fprintln(w, "===== end of diagnostics =====")
}

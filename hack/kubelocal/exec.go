package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// run runs a command to completion and returns its stdout; on failure the
// error carries the command and the tail of its output.
func run(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(lastLines(errb.String()+out.String(), 25))
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, msg)
	}
	return out.String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kubectl runs the cluster's kubectl with the admin kubeconfig.
func kubectl(ctx context.Context, c *Config, args ...string) (string, error) {
	return run(ctx, c.Dir, []string{"KUBECONFIG=" + c.kubeconfig()}, c.p("bin", "kubectl"), args...)
}

// kubectlIn is kubectl with stdin.
func kubectlIn(ctx context.Context, c *Config, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.p("bin", "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig())
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, lastLines(string(out), 25))
	}
	return string(out), nil
}

// helm runs the cluster's helm with the admin kubeconfig.
func helm(ctx context.Context, c *Config, args ...string) (string, error) {
	return run(ctx, c.Repo, []string{"KUBECONFIG=" + c.kubeconfig(), "HELM_CACHE_HOME=" + c.p("helm", "cache"),
		"HELM_CONFIG_HOME=" + c.p("helm", "config"), "HELM_DATA_HOME=" + c.p("helm", "data")}, c.p("bin", "helm"), args...)
}

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// valuesYAML is the chart's values for this cluster: the preloaded images
// (pullPolicy Never: there is no registry to fall back to), the external
// PostgreSQL on the host, and the cluster's CIDRs for the preflight.
// Everything else is the chart's default, as users get it.
func valuesYAML(c *Config) string {
	var b strings.Builder
	b.WriteString("# Written by make kube-up (hack/kubelocal): the chart's values for the local cluster.\nimages:\n")
	for _, im := range cubeImages {
		fmt.Fprintf(&b, "  %s:\n    repository: %s/%s\n    tag: %q\n    pullPolicy: Never\n", im.value, c.ImageRepo, im.name, c.Tag)
	}
	fmt.Fprintf(&b, `database:
  mode: external
  external:
    existingSecret: cube-db
    urlKey: url
cubeNodeBootstrap:
  preflight:
    serviceCIDRs: [%s]
    podCIDRs: [%s]
`, c.SvcCIDR, c.PodCIDR)
	return b.String()
}

func installChart(ctx context.Context, c *Config, dbURL string) error {
	if err := writeFile(c.valuesFile(), valuesYAML(c)); err != nil {
		return err
	}
	if _, err := kubectl(ctx, c, "label", "node", c.NodeName, "cube.dev/compute=true", "--overwrite"); err != nil {
		return err
	}
	ns := fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: cube-db, namespace: %s}\ntype: Opaque\ndata: {url: %s}\n",
		c.Namespace, c.Namespace, base64.StdEncoding.EncodeToString([]byte(dbURL)))
	if _, err := kubectlIn(ctx, c, ns, "apply", "-f", "-"); err != nil {
		return err
	}
	start := time.Now()
	if _, err := helm(ctx, c, "upgrade", "--install", c.Release, c.chart(), "-n", c.Namespace,
		"-f", c.valuesFile(), "--timeout", "10m"); err != nil {
		return fmt.Errorf("helm install: %w", err)
	}
	slog.Info("chart installed", "release", c.Release, "namespace", c.Namespace, "took", time.Since(start).Round(time.Second))
	return nil
}

// serverAccess returns the cube-server Service's URL (its ClusterIP, which
// the host reaches through kube-proxy) and the API key.
func serverAccess(ctx context.Context, c *Config) (url, key string, err error) {
	ip, err := kubectl(ctx, c, "-n", c.Namespace, "get", "service", "cube-server", "-o", "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}")
	if err != nil {
		return "", "", err
	}
	k, err := kubectl(ctx, c, "-n", c.Namespace, "get", "secret", "cube-api-key", "-o", "jsonpath={.data.api-key}")
	if err != nil {
		return "", "", err
	}
	kb, err := base64.StdEncoding.DecodeString(k)
	if err != nil {
		return "", "", fmt.Errorf("secret cube-api-key: %w", err)
	}
	return "http://" + strings.TrimSpace(ip), string(kb), nil
}

// waitCubeNode polls `cube node ls` until this node is Ready.
func waitCubeNode(ctx context.Context, c *Config, url, key string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	var last string
	for {
		out, err := run(ctx, c.Dir, nil, c.cubeBin(), "node", "ls", "--json", "--server", url, "--api-key", key)
		if err != nil {
			last = err.Error()
		} else {
			var nodes []struct{ ID, State, Version, Reason string }
			if err := json.Unmarshal([]byte(out), &nodes); err != nil {
				last = err.Error()
			}
			last = strings.TrimSpace(out)
			for _, n := range nodes {
				if n.ID == c.NodeName && n.State == "Ready" {
					slog.Info("Cube node Ready", "node", n.ID, "version", n.Version, "took", time.Since(start).Round(time.Second))
					return nil
				}
			}
		}
		// A cubelet that keeps crashing will not become Ready: say so now.
		if n := cubeNodeRestarts(ctx, c); n >= 3 {
			return fmt.Errorf("the cube-node Pod's containers restarted %d times (diagnostics follow); last `cube node ls`: %s", n, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Cube node %s not Ready after %s; last `cube node ls`: %s", c.NodeName, timeout, last)
		case <-time.After(2 * time.Second):
		}
	}
}

// cubeNodeRestarts is the highest container restart count of the cube-node
// Pods (0 when unknown).
func cubeNodeRestarts(ctx context.Context, c *Config) int {
	out, err := kubectl(ctx, c, "-n", c.Namespace, "get", "pods", "-l", "app.kubernetes.io/component=node",
		"-o", "jsonpath={.items[*].status.containerStatuses[*].restartCount}")
	if err != nil {
		return 0
	}
	most := 0
	for _, f := range strings.Fields(out) {
		if n, err := strconv.Atoi(f); err == nil && n > most {
			most = n
		}
	}
	return most
}

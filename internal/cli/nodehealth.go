package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/cube-dev/cube/internal/cluster"
)

// runNodeCheckHealth is `cube node check-health`: every Ready node must
// report that its cubelet API answers and, with --prep-generation N, a
// passed preflight fingerprint of generation N. Exit 1 otherwise (also when
// no node is Ready), with one line per problem saying what to check. The
// helm test cube-test-node-health runs it.
func runNodeCheckHealth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("node check-health", stderr)
	server := fs.String("server", envDefault("CUBE_SERVER", "http://127.0.0.1:3000"), "URL of the cube server (env CUBE_SERVER)")
	key := fs.String("api-key", os.Getenv("CUBE_API_KEY"), "API key (env CUBE_API_KEY)")
	gen := fs.Int("prep-generation", 0, "also require a passed preflight fingerprint of this prep generation (0: socket only)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 || *gen < 0 {
		return usageError{"usage: cube node check-health [--prep-generation N] --server URL --api-key KEY"}
	}
	c := adminClient{base: strings.TrimRight(*server, "/"), key: *key}
	var nodes []cluster.NodeStatus
	if err := c.do(ctx, http.MethodGet, "/nodes", nil, &nodes); err != nil {
		return err
	}
	res := cluster.CheckNodes(nodes, *gen)
	for _, group := range [][]string{res.Healthy, res.Skipped, res.Problems} {
		for _, line := range group {
			fmt.Fprintln(stdout, line)
		}
	}
	switch {
	case res.Ready == 0:
		return fmt.Errorf("no Ready node registered with %s: check that cube-node Pods run on the compute nodes", c.base)
	case !res.OK():
		return fmt.Errorf("%d of %d Ready node(s) unhealthy", res.Ready-len(res.Healthy), res.Ready)
	}
	fmt.Fprintf(stdout, "%d Ready node(s) healthy\n", res.Ready)
	return nil
}

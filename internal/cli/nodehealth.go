package cli

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/cluster"
)

// newNodeCheckHealthCmd is `cube node check-health`: every Ready node must
// report that its cubelet API answers and, with --prep-generation N, a
// passed preflight fingerprint of generation N. Exit 1 otherwise (also when
// no node is Ready), with one line per problem saying what to check. The
// helm test cube-test-node-health runs it.
func newNodeCheckHealthCmd() *cobra.Command {
	var server, key string
	var gen int
	const usage = "usage: cube node check-health [--prep-generation N] --server URL --api-key KEY"
	c := &cobra.Command{
		Use:   "check-health",
		Short: "exit 1 unless every Ready node's cubelet API answers and (--prep-generation N) its preflight passed for N",
		Args:  exactArgs(0, usage),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gen < 0 {
				return usageError{usage}
			}
			out := cmd.OutOrStdout()
			c := adminClient{base: strings.TrimRight(server, "/"), key: key}
			var nodes []cluster.NodeStatus
			if err := c.do(cmd.Context(), http.MethodGet, "/nodes", nil, &nodes); err != nil {
				return err
			}
			res := cluster.CheckNodes(nodes, gen)
			for _, group := range [][]string{res.Healthy, res.Skipped, res.Problems} {
				for _, line := range group {
					fmt.Fprintln(out, line)
				}
			}
			switch {
			case res.Ready == 0:
				return fmt.Errorf("no Ready node registered with %s: check that cube-node Pods run on the compute nodes", c.base)
			case !res.OK():
				return fmt.Errorf("%d of %d Ready node(s) unhealthy", res.Ready-len(res.Healthy), res.Ready)
			}
			fmt.Fprintf(out, "%d Ready node(s) healthy\n", res.Ready)
			return nil
		},
	}
	addServerFlags(c, &server, &key)
	c.Flags().IntVar(&gen, "prep-generation", 0, "also require a passed preflight fingerprint of this prep generation (0: socket only)")
	return c
}

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/cluster"
)

// addServerFlags registers --server (env CUBE_SERVER) and --api-key (env
// CUBE_API_KEY), the server a cluster verb talks to.
func addServerFlags(c *cobra.Command, server, key *string) {
	fs := c.Flags()
	fs.StringVar(server, "server", "http://127.0.0.1:3000", "URL of the cube server")
	bindEnv(fs, "server", "CUBE_SERVER")
	fs.StringVar(key, "api-key", "", "API key")
	bindEnv(fs, "api-key", "CUBE_API_KEY")
}

// newNodeAdminCmd is `cube node ls|isolate|uncordon|drain|delete` against
// a server's node administration API. Every verb accepts every flag, as it
// always has; help shows those that matter to the verb.
func newNodeAdminCmd(verb, short string) *cobra.Command {
	var server, key, policy string
	var asJSON, force, wait bool
	var grace, deadline time.Duration
	c := &cobra.Command{Use: verb + " NODE", Short: short, Args: exactArgs(1, fmt.Sprintf("usage: cube node %s NODE --server URL --api-key KEY", verb))}
	if verb == "ls" {
		c.Use, c.Args = "ls", noArgs
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, out := cmd.Context(), cmd.OutOrStdout()
		ac := adminClient{base: strings.TrimRight(server, "/"), key: key}
		if verb == "ls" {
			var nodes []cluster.NodeStatus
			if err := ac.do(ctx, http.MethodGet, "/nodes", nil, &nodes); err != nil {
				return err
			}
			if asJSON {
				return printJSON(out, nodes)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tVERSION\tSANDBOXES\tCPU\tMEMORY_MB\tADDRESS\tHEALTH\tREASON")
			for _, n := range nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\n", n.ID, n.State, n.Version, n.Sandboxes,
					n.UsedCPU, n.Capacity.CPUCount, n.UsedMemoryMB, n.Capacity.MemoryMB, n.Address, n.Health.Summary(), n.Reason)
			}
			return tw.Flush()
		}
		id := args[0]
		var st cluster.NodeStatus
		switch verb {
		case "isolate", "uncordon":
			if err := ac.do(ctx, http.MethodPost, "/nodes/"+id+"/"+verb, nil, &st); err != nil {
				return err
			}
		case "delete":
			path := "/nodes/" + id
			if force {
				path += "?force=true"
			}
			if err := ac.do(ctx, http.MethodDelete, path, nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(out, "node %s deleted\n", id)
			return nil
		case "drain":
			gs := int(grace.Seconds())
			body := cluster.DrainRequest{Policy: cluster.DrainPolicy(policy), GraceSeconds: &gs, DeadlineSeconds: int(deadline.Seconds())}
			if err := ac.do(ctx, http.MethodPost, "/nodes/"+id+"/drain", body, &st); err != nil {
				return err
			}
			if wait {
				return followDrain(ctx, ac, id, out)
			}
		}
		if asJSON {
			return printJSON(out, st)
		}
		fmt.Fprintf(out, "node %s: %s\n", st.ID, st.State)
		return nil
	}
	addServerFlags(c, &server, &key)
	fs := c.Flags()
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	fs.BoolVar(&force, "force", false, "delete: also forget the node's sandboxes")
	fs.StringVar(&policy, "policy", "kill", "drain: what to do after the grace period: kill, or wait for sandbox TTLs")
	fs.DurationVar(&grace, "grace", cluster.DefaultDrainGrace, "drain: time for in-flight creates to finish")
	fs.DurationVar(&deadline, "deadline", 0, "drain with --policy wait: kill what is left after this long (0 = wait for every TTL)")
	fs.BoolVar(&wait, "wait", true, "drain: follow progress until the node is empty")
	mine := map[string][]string{
		"ls": {"json"}, "isolate": {"json"}, "uncordon": {"json"},
		"drain":  {"json", "policy", "grace", "deadline", "wait"},
		"delete": {"force"},
	}[verb]
	for _, name := range []string{"json", "force", "policy", "grace", "deadline", "wait"} {
		if !containsString(mine, name) {
			fs.MarkHidden(name)
		}
	}
	return c
}

// followDrain prints drain progress until the node is empty.
func followDrain(ctx context.Context, c adminClient, id string, out io.Writer) error {
	last := ""
	for {
		var st cluster.NodeStatus
		if err := c.do(ctx, http.MethodGet, "/nodes/"+id, nil, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("node %s: %s", id, st.State)
		if st.Drain != nil {
			line += fmt.Sprintf(", drain %s (%s), %d sandboxes left", st.Drain.Phase, st.Drain.Policy, st.Drain.Remaining)
			if st.Drain.Phase == "done" {
				fmt.Fprintln(out, line)
				return nil
			}
		}
		if line != last {
			fmt.Fprintln(out, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// adminClient calls a server's node administration API with an API key.
type adminClient struct{ base, key string }

func (c adminClient) do(ctx context.Context, method, path string, body, out any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	res, err := cluster.SendAdmin(ctx, http.DefaultClient, c.base, c.key, method, path, b)
	if err != nil {
		return fmt.Errorf("reach server: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		var e struct{ Message string }
		json.NewDecoder(res.Body).Decode(&e)
		return fmt.Errorf("server: %s: %s", res.Status, e.Message)
	}
	if out == nil || res.StatusCode == http.StatusNoContent {
		return nil
	}
	return json.NewDecoder(res.Body).Decode(out)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

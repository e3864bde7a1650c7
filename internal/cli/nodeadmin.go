package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cube-dev/cube/internal/cluster"
)

// nodeAdmin returns the `cube node <verb>` runner for a server-side verb.
func nodeAdmin(verb string) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runNodeAdmin(ctx, verb, args, stdout, stderr)
	}
}

// runNodeAdmin implements `cube node ls|isolate|uncordon|drain|delete`
// against a server's node administration API.
func runNodeAdmin(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("node "+verb, stderr)
	server := fs.String("server", envDefault("CUBE_SERVER", "http://127.0.0.1:3000"), "URL of the cube server (env CUBE_SERVER)")
	key := fs.String("api-key", os.Getenv("CUBE_API_KEY"), "API key (env CUBE_API_KEY)")
	asJSON := fs.Bool("json", false, "print JSON")
	force := fs.Bool("force", false, "delete: also forget the node's sandboxes")
	policy := fs.String("policy", "kill", "drain: what to do after the grace period: kill, or wait for sandbox TTLs")
	grace := fs.Duration("grace", cluster.DefaultDrainGrace, "drain: time for in-flight creates to finish")
	deadline := fs.Duration("deadline", 0, "drain with --policy wait: kill what is left after this long (0 = wait for every TTL)")
	wait := fs.Bool("wait", true, "drain: follow progress until the node is empty")
	if err := parseFlags(fs, reorder(fs, args)); err != nil {
		return err
	}
	c := adminClient{base: strings.TrimRight(*server, "/"), key: *key}
	if verb == "ls" {
		var nodes []cluster.NodeStatus
		if err := c.do(ctx, http.MethodGet, "/nodes", nil, &nodes); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, nodes)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tVERSION\tSANDBOXES\tCPU\tMEMORY_MB\tADDRESS\tHEALTH\tREASON")
		for _, n := range nodes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\n", n.ID, n.State, n.Version, n.Sandboxes,
				n.UsedCPU, n.Capacity.CPUCount, n.UsedMemoryMB, n.Capacity.MemoryMB, n.Address, n.Health.Summary(), n.Reason)
		}
		return tw.Flush()
	}
	if fs.NArg() != 1 {
		return usageError{fmt.Sprintf("usage: cube node %s NODE --server URL --api-key KEY", verb)}
	}
	id := fs.Arg(0)
	var st cluster.NodeStatus
	switch verb {
	case "isolate", "uncordon":
		if err := c.do(ctx, http.MethodPost, "/nodes/"+id+"/"+verb, nil, &st); err != nil {
			return err
		}
	case "delete":
		path := "/nodes/" + id
		if *force {
			path += "?force=true"
		}
		if err := c.do(ctx, http.MethodDelete, path, nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "node %s deleted\n", id)
		return nil
	case "drain":
		gs := int(grace.Seconds())
		body := cluster.DrainRequest{Policy: cluster.DrainPolicy(*policy), GraceSeconds: &gs, DeadlineSeconds: int(deadline.Seconds())}
		if err := c.do(ctx, http.MethodPost, "/nodes/"+id+"/drain", body, &st); err != nil {
			return err
		}
		if *wait {
			return followDrain(ctx, c, id, stdout)
		}
	}
	if *asJSON {
		return printJSON(stdout, st)
	}
	fmt.Fprintf(stdout, "node %s: %s\n", st.ID, st.State)
	return nil
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

type adminClient struct{ base, key string }

func (c adminClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
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

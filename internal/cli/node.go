package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/preflight"
)

// nodeVerbs are the `cube node` subcommands. The local ones below inspect
// and repair this machine's node state directly (--data-dir selects it).
func nodeVerbs() map[string]command {
	return map[string]command{
		"mapdump": {"list host-port mappings with their owners (owned, orphan, conflict)", runNodeMapdump},
		"doctor":  {"report orphans, dead shims, bad records and preflight problems; exit 1 if any", runNodeDoctor},
		"gc":      {"remove orphans and reap dead sandboxes (refused while cube runs on the node)", runNodeGC},
		"cleanup": {"uninstall: kill every sandbox, remove the dataplane, cgroups and (--purge-state) node state", runNodeCleanup},
		// Cluster verbs talk to a server (--server URL --api-key KEY).
		"ls":           {"list the server's nodes with state, version, load and health (--json)", nodeAdmin("ls")},
		"check-health": {"exit 1 unless every Ready node's cubelet API answers and (--prep-generation N) its preflight passed for N", runNodeCheckHealth},
		"isolate":      {"stop scheduling onto a node (its sandboxes keep running)", nodeAdmin("isolate")},
		"uncordon":     {"make an isolated or drained node schedulable again", nodeAdmin("uncordon")},
		"drain":        {"isolate a node, wait --grace, then kill its sandboxes or wait for their TTLs (--policy)", nodeAdmin("drain")},
		"delete":       {"deregister an isolated, empty node (--force: any node)", nodeAdmin("delete")},
	}
}

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	verbs := nodeVerbs()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		nodeUsage(stdout, verbs)
		if len(args) == 0 {
			return usageError{"missing verb"}
		}
		return nil
	}
	v, ok := verbs[args[0]]
	if !ok {
		nodeUsage(stderr, verbs)
		return usageError{fmt.Sprintf("unknown verb %q", args[0])}
	}
	return v.run(ctx, args[1:], stdout, stderr)
}

func nodeUsage(w io.Writer, verbs map[string]command) {
	fmt.Fprintln(w, "usage: cube node <verb> [flags]\n\nverbs:")
	names := make([]string, 0, len(verbs))
	for n := range verbs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, verbs[n].summary)
	}
}

// nodeFlags are the flags that locate a node's state on this machine; they
// mirror `cube up`'s so the same values select the same node.
type nodeFlags struct {
	dataDir, runDir, envd, nodeCIDR, logLevel *string
	cgroupParent                              *string
	net                                       *networkFlags
	network                                   cubevs.Config
}

func addNodeFlags(fs *flag.FlagSet) *nodeFlags {
	f := &nodeFlags{network: cubevs.DefaultConfig()}
	f.dataDir = fs.String("data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory of the node (env CUBE_DATA_DIR)")
	f.runDir = fs.String("run-dir", envDefault("CUBE_RUN_DIR", "/run/cube"), "runtime directory of the node (env CUBE_RUN_DIR)")
	f.envd = fs.String("envd", envDefault("CUBE_ENVD", ""), "path of the envd binary (default: next to the cube binary)")
	f.nodeCIDR = fs.String("node-cidr", envDefault("CUBE_NODE_CIDR", f.network.NodeCIDR.String()), "sandbox address range of the node")
	f.cgroupParent = fs.String("cgroup-parent", envDefault("CUBE_CGROUP_PARENT", "cube"), "cgroup parent of the node's sandboxes")
	f.logLevel = fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "warn"), "debug, info, warn or error")
	f.net = addNetworkFlags(fs, &f.network)
	return f
}

// config turns the parsed flags into the cubelet configuration of the node.
func (f *nodeFlags) config(stderr io.Writer) (cubelet.Config, error) {
	p, err := netip.ParsePrefix(*f.nodeCIDR)
	if err != nil {
		return cubelet.Config{}, usageError{fmt.Sprintf("--node-cidr: %v", err)}
	}
	n := f.network
	n.NodeCIDR = p
	n.RunDir = *f.runDir
	if err := f.net.apply(&n); err != nil {
		return cubelet.Config{}, err
	}
	envd := *f.envd
	if envd == "" {
		if exe, err := os.Executable(); err == nil {
			envd = filepath.Join(filepath.Dir(exe), "envd")
		}
	}
	return cubelet.Config{
		StateDir:     filepath.Join(*f.dataDir, "node"),
		EnvdPath:     envd,
		CgroupParent: *f.cgroupParent,
		Network:      n,
		Logger:       newLogger(stderr, *f.logLevel),
	}, nil
}

func parseNodeFlags(name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (cubelet.Config, error) {
	fs := newFlagSet("node "+name, stderr)
	nf := addNodeFlags(fs)
	if extra != nil {
		extra(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return cubelet.Config{}, err
	}
	if fs.NArg() > 0 {
		return cubelet.Config{}, usageError{fmt.Sprintf("unexpected arguments %v", fs.Args())}
	}
	return nf.config(stderr)
}

// mapdumpOutput is mapdump's JSON document. No field name contains the word
// "orphan": only a mapping's status does, so grep -ci orphan counts them.
type mapdumpOutput struct {
	Source    string                  `json:"source"`
	Note      string                  `json:"note,omitempty"`
	Dataplane bool                    `json:"dataplane"`
	Mappings  []cubelet.MappingStatus `json:"mappings"`
}

func runNodeMapdump(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cfg, err := parseNodeFlags("mapdump", args, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON (one field per line)")
	})
	if err != nil {
		return err
	}
	in, err := cubelet.Inspect(ctx, cfg)
	if err != nil {
		return err
	}
	out := mapdumpOutput{Source: in.Source, Note: in.Note, Dataplane: in.Dataplane, Mappings: in.Mappings}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "# owner records from %s\n", out.Source)
	if out.Note != "" {
		fmt.Fprintf(stdout, "# %s\n", out.Note)
	}
	if !out.Dataplane {
		fmt.Fprintf(stdout, "# no dataplane pinned at %s\n", cfg.Network.DataplanePin())
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST-PORT\tSANDBOX-IP\tGUEST-PORT\tOWNER\tSTATUS\tDETAIL")
	counts := map[string]int{}
	for _, m := range out.Mappings {
		counts[m.Status]++
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", m.HostPort, m.SandboxIP, m.GuestPort, m.Owner, m.Status, m.Detail)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "# %d mappings: %d owned, %d conflicting, %d without a live owner\n",
		len(out.Mappings), counts[cubelet.StatusOwned], counts[cubelet.StatusConflict], counts[cubelet.StatusOrphan])
	return nil
}

// doctorOutput is doctor's JSON document.
type doctorOutput struct {
	Problems  int                     `json:"problems"`
	Preflight []cubelet.Check         `json:"preflight"`
	Source    string                  `json:"source"`
	Note      string                  `json:"note,omitempty"`
	Mappings  []cubelet.MappingStatus `json:"mappings"`
	Findings  []cubelet.Finding       `json:"findings"`
	Live      []string                `json:"live"`
	// Runtime and Supervisors: what the node starts sandboxes with and the
	// live supervisors' versions (informational: never a problem).
	Runtime     *cubelet.RuntimeInfo       `json:"runtime,omitempty"`
	Supervisors []cubelet.SupervisorStatus `json:"supervisors"`
}

func runNodeDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	cfg, err := parseNodeFlags("doctor", args, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	})
	if err != nil {
		return err
	}
	in, err := cubelet.Inspect(ctx, cfg)
	if err != nil {
		return err
	}
	out := doctorOutput{Preflight: cubelet.Preflight(cfg), Source: in.Source, Note: in.Note, Findings: in.Findings, Live: in.Live,
		Runtime: in.Runtime, Supervisors: in.Supervisors}
	out.Problems = in.Problems()
	for _, m := range in.Mappings {
		if m.Status != cubelet.StatusOwned {
			out.Mappings = append(out.Mappings, m)
		}
	}
	for _, c := range out.Preflight {
		if !c.OK {
			out.Problems++
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		printDoctor(stdout, out)
	}
	if out.Problems > 0 {
		return fmt.Errorf("%d problems found", out.Problems)
	}
	return nil
}

func printDoctor(w io.Writer, out doctorOutput) {
	fmt.Fprintln(w, "preflight:")
	for _, c := range out.Preflight {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-18s %s\n", mark, c.Name, c.Detail)
	}
	fmt.Fprintf(w, "node state (owner records from %s; %d live sandboxes):\n", out.Source, len(out.Live))
	if out.Note != "" {
		fmt.Fprintf(w, "  note: %s\n", out.Note)
	}
	for _, m := range out.Mappings {
		fmt.Fprintf(w, "  %-8s mapping host port %d -> %s:%d (owner %s): %s\n", m.Status, m.HostPort, m.SandboxIP, m.GuestPort, m.Owner, m.Detail)
	}
	for _, f := range out.Findings {
		fmt.Fprintf(w, "  %-8s %s %s: %s\n", f.Status, f.Kind, f.Object, f.Detail)
	}
	if len(out.Mappings) == 0 && len(out.Findings) == 0 {
		fmt.Fprintln(w, "  clean")
	}
	printSupervisors(w, out.Runtime, out.Supervisors)
	if out.Problems > 0 {
		fmt.Fprintf(w, "%d problems; `cube node gc` removes orphans and dead sandboxes (a running cube does it by itself)\n", out.Problems)
	}
}

func runNodeGC(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseNodeFlags("gc", args, stderr, nil)
	if err != nil {
		return err
	}
	rep, err := cubelet.GC(ctx, cfg)
	if err != nil {
		return err
	}
	for _, o := range rep.Orphans {
		fmt.Fprintf(stdout, "removed orphan %s\n", o)
	}
	for _, id := range rep.Reaped {
		fmt.Fprintf(stdout, "reaped sandbox %s\n", id)
	}
	if len(rep.Bad) > 0 {
		fmt.Fprintf(stdout, "left for an operator, undecodable records: %s\n", strings.Join(rep.Bad, " "))
	}
	fmt.Fprintf(stdout, "gc: %d removed, %d reaped, %d kept (%d records rebuilt), %d mappings repaired\n",
		len(rep.Orphans), len(rep.Reaped), len(rep.Adopted), len(rep.Rebuilt), rep.Repaired)
	return nil
}

func runNodeCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var purge *bool
	cfg, err := parseNodeFlags("cleanup", args, stderr, func(fs *flag.FlagSet) {
		purge = fs.Bool("purge-state", false, "also remove the node state dir (<data-dir>/node)")
	})
	if err != nil {
		return err
	}
	rep, err := cubelet.Cleanup(ctx, cfg, *purge)
	for _, id := range rep.Sandboxes {
		fmt.Fprintf(stdout, "killed sandbox %s\n", id)
	}
	for _, id := range rep.PoolSlots {
		fmt.Fprintf(stdout, "removed pool slot %s\n", id)
	}
	if err != nil {
		return err
	}
	if *purge {
		// The binds `cube kube share-mounts` made for the chart's
		// Bidirectional volumes (hosts whose / is private).
		released, err := preflight.ReleaseShared([]string{cfg.Network.RunDir, filepath.Dir(cfg.StateDir)})
		for _, d := range released {
			fmt.Fprintf(stdout, "unmounted the shared bind of %s\n", d)
		}
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, cleanupSummary(rep))
	return nil
}

// printSupervisors shows the runtime the node starts sandboxes with, the
// live supervisors per version, and those started by an earlier runtime
// (they keep running, with their old binary and mount namespace, until
// their sandbox ends; warm-pool slots are replaced at the cubelet's start).
func printSupervisors(w io.Writer, rt *cubelet.RuntimeInfo, sups []cubelet.SupervisorStatus) {
	if rt != nil {
		ns := "the cubelet's own mount namespace"
		if rt.MountNS != "" {
			ns = "the host mount namespace (" + rt.MountNS + ")"
		}
		fmt.Fprintf(w, "runtime: %s, shims %s in %s\n", rt.Stamp, rt.Shim, ns)
	} else {
		fmt.Fprintf(w, "runtime: unknown (no %s: no cubelet of this version has started on this node)\n", cubelet.RuntimeFile)
	}
	counts := cubelet.SupervisorVersions(sups)
	versions := make([]string, 0, len(counts))
	for v := range counts {
		versions = append(versions, v)
	}
	sort.Strings(versions)
	parts := make([]string, len(versions))
	for i, v := range versions {
		parts[i] = fmt.Sprintf("%s x%d", v, counts[v])
	}
	fmt.Fprintf(w, "supervisors: %d live", len(sups))
	if len(parts) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	if rt == nil {
		return
	}
	for _, s := range sups {
		if !s.Current {
			fmt.Fprintf(w, "  earlier runtime: %s supervisor %d version %s, %s, %s\n", s.Owner, s.PID, s.Version, s.Exe, s.MountNS)
		}
	}
}

// cleanupSummary is the last line of `cube node cleanup`: user sandboxes
// and warm-pool slots counted apart (a node with no sandbox still has its
// pool).
func cleanupSummary(rep cubelet.CleanupReport) string {
	return fmt.Sprintf("cleanup: %d sandboxes killed, %d pool slots removed, dataplane removed: %v, state removed: %v",
		len(rep.Sandboxes), len(rep.PoolSlots), rep.Dataplane, rep.StateDir)
}

package nodeops

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/preflight"
)

// mapdumpReport is mapdump's JSON document. No field name contains the
// word "orphan": only a mapping's status does, so grep -ci orphan counts
// them.
type mapdumpReport struct {
	Source    string                  `json:"source"`
	Note      string                  `json:"note,omitempty"`
	Dataplane bool                    `json:"dataplane"`
	Mappings  []cubelet.MappingStatus `json:"mappings"`
}

// Mapdump writes the node's host-port mappings with their owners (owned,
// orphan, conflict). It reads only: a running cubelet may hold the node.
func Mapdump(ctx context.Context, cfg cubelet.Config, f Format, w io.Writer) error {
	in, err := cubelet.Inspect(ctx, cfg)
	if err != nil {
		return err
	}
	out := mapdumpReport{Source: in.Source, Note: in.Note, Dataplane: in.Dataplane, Mappings: in.Mappings}
	if f == JSON {
		return writeJSON(w, out)
	}
	fmt.Fprintf(w, "# owner records from %s\n", out.Source)
	if out.Note != "" {
		fmt.Fprintf(w, "# %s\n", out.Note)
	}
	if !out.Dataplane {
		fmt.Fprintf(w, "# no dataplane pinned at %s\n", cfg.Network.DataplanePin())
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST-PORT\tSANDBOX-IP\tGUEST-PORT\tOWNER\tSTATUS\tDETAIL")
	counts := map[string]int{}
	for _, m := range out.Mappings {
		counts[m.Status]++
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", m.HostPort, m.SandboxIP, m.GuestPort, m.Owner, m.Status, m.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "# %d mappings: %d owned, %d conflicting, %d without a live owner\n",
		len(out.Mappings), counts[cubelet.StatusOwned], counts[cubelet.StatusConflict], counts[cubelet.StatusOrphan])
	return err
}

// doctorReport is doctor's JSON document.
type doctorReport struct {
	Problems  int                     `json:"problems"`
	Preflight []preflight.NodeCheck   `json:"preflight"`
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

// Doctor writes the node's preflight checks, orphans, dead shims and bad
// records; the error counts the problems found (none: nil). It changes
// nothing.
func Doctor(ctx context.Context, cfg cubelet.Config, f Format, w io.Writer) error {
	in, err := cubelet.Inspect(ctx, cfg)
	if err != nil {
		return err
	}
	out := doctorReport{Preflight: preflight.CheckNode(preflight.NodeSetup{Network: cfg.Network, EnvdPath: cfg.EnvdPath}), Source: in.Source, Note: in.Note, Findings: in.Findings, Live: in.Live,
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
	if f == JSON {
		if err := writeJSON(w, out); err != nil {
			return err
		}
	} else {
		writeDoctor(w, out)
	}
	if out.Problems > 0 {
		return fmt.Errorf("%d problems found", out.Problems)
	}
	return nil
}

func writeDoctor(w io.Writer, out doctorReport) {
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
	writeSupervisors(w, out.Runtime, out.Supervisors)
	if out.Problems > 0 {
		fmt.Fprintf(w, "%d problems; `cube node gc` removes orphans and dead sandboxes (a running cube does it by itself)\n", out.Problems)
	}
}

// writeSupervisors shows the runtime the node starts sandboxes with, the
// live supervisors per version, and those started by an earlier runtime
// (they keep running, with their old binary and mount namespace, until
// their sandbox ends; warm-pool slots are replaced at the cubelet's start).
func writeSupervisors(w io.Writer, rt *cubelet.RuntimeInfo, sups []cubelet.SupervisorStatus) {
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

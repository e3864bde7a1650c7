package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/hostnetgate"
	"github.com/cube-dev/cube/internal/preflight"
	"github.com/cube-dev/cube/internal/version"
)

// preflightFlags are the flags `cube preflight` and `cube prep` share.
type preflightFlags struct {
	strict, asJSON                              *bool
	nodeCIDR, serviceCIDRs, podCIDRs, portRange *string
	nodePortRange, runtime, server, cniDir      *string
}

func addPreflightFlags(fs *flag.FlagSet) *preflightFlags {
	d := preflight.DefaultConfig()
	return &preflightFlags{
		strict:        fs.Bool("strict", false, "treat warnings (CNI, kube-proxy, route overlaps) as failures"),
		asJSON:        fs.Bool("json", false, "print the report as JSON"),
		nodeCIDR:      fs.String("node-cidr", envDefault("CUBE_NODE_CIDR", d.NodeCIDR.String()), "sandbox address range of this node"),
		serviceCIDRs:  fs.String("service-cidr", "", "Kubernetes Service CIDRs, comma-separated"),
		podCIDRs:      fs.String("pod-cidr", "", "Kubernetes Pod CIDRs, comma-separated"),
		portRange:     fs.String("port-range", envDefault("CUBE_PORT_RANGE", fmt.Sprintf("%d-%d", d.PortMin, d.PortMax)), "host ports mapped to sandboxes, MIN-MAX"),
		nodePortRange: fs.String("nodeport-range", "", "Kubernetes NodePort range MIN-MAX (e.g. 30000-32767; empty: not checked)"),
		runtime:       fs.String("runtime", "auto", "sandbox runtime: auto (vm where /dev/kvm exists), ns or vm"),
		server:        fs.String("server", "", "Cube server URL to probe with GET /health (empty: not checked)"),
		cniDir:        fs.String("cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory of the host"),
	}
}

func (f *preflightFlags) config() (preflight.Config, error) {
	cfg := preflight.DefaultConfig()
	cfg.Strict, cfg.Runtime, cfg.ServerURL = *f.strict, *f.runtime, *f.server
	var err error
	if cfg.NodeCIDR, err = netip.ParsePrefix(*f.nodeCIDR); err != nil {
		return cfg, usageError{fmt.Sprintf("--node-cidr: %v", err)}
	}
	if cfg.ServiceCIDRs, err = parsePrefixes(*f.serviceCIDRs); err != nil {
		return cfg, usageError{fmt.Sprintf("--service-cidr: %v", err)}
	}
	if cfg.PodCIDRs, err = parsePrefixes(*f.podCIDRs); err != nil {
		return cfg, usageError{fmt.Sprintf("--pod-cidr: %v", err)}
	}
	if cfg.PortMin, cfg.PortMax, err = parsePortRange(*f.portRange); err != nil {
		return cfg, usageError{fmt.Sprintf("--port-range: %v", err)}
	}
	cfg.NodePortMin, cfg.NodePortMax = 0, 0
	if *f.nodePortRange != "" {
		if cfg.NodePortMin, cfg.NodePortMax, err = parsePortRange(*f.nodePortRange); err != nil {
			return cfg, usageError{fmt.Sprintf("--nodeport-range: %v", err)}
		}
	}
	return cfg, nil
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, err
		}
		out = append(out, pf)
	}
	return out, nil
}

func parsePortRange(s string) (uint16, uint16, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(lo, 10, 16)
	b, err2 := strconv.ParseUint(hi, 10, 16)
	if !ok || err1 != nil || err2 != nil || a == 0 || b < a {
		return 0, 0, fmt.Errorf("%q: want MIN-MAX within 1-65535", s)
	}
	return uint16(a), uint16(b), nil
}

// runPreflightChecks gathers the host's facts, checks them and prints the
// report. The error is non-nil when the report did not pass.
func runPreflightChecks(ctx context.Context, pf *preflightFlags, stdout io.Writer) (preflight.Report, preflight.Facts, error) {
	cfg, err := pf.config()
	if err != nil {
		return preflight.Report{}, preflight.Facts{}, err
	}
	facts := preflight.Gather(ctx, preflight.GatherOptions{CNIConfDir: *pf.cniDir, ServerURL: cfg.ServerURL})
	rep := preflight.Check(cfg, facts)
	if *pf.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return rep, facts, err
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, r := range rep.Results {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Status, r.Name, r.Message)
		}
		tw.Flush()
		fmt.Fprintf(stdout, "runtime: %s; passed: %t (strict: %t)\n", rep.Runtime, rep.Passed, rep.Strict)
	}
	if !rep.Passed {
		names := make([]string, 0, len(rep.Failed()))
		for _, r := range rep.Failed() {
			names = append(names, r.Name)
		}
		return rep, facts, fmt.Errorf("preflight failed: %s: %w", strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
	}
	return rep, facts, nil
}

// runPreflight is `cube preflight`: exit 0 when the host passes, 1 when a
// check fails (or warns, with --strict), 2 on bad flags.
func runPreflight(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("preflight", stderr)
	pf := addPreflightFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %v", fs.Args())}
	}
	_, _, err := runPreflightChecks(ctx, pf, stdout)
	return err
}

// runPrep is `cube prep`: preflight, node preparation (directories), then
// the fingerprint <dir>/<generation>.fingerprint, written atomically and
// only when preflight passed (a failure writes <dir>/<generation>.failed
// with the failing checks instead, for the cubelet to report). With --hold
// it then waits for a signal, so a DaemonSet Pod stays Running with the
// report in its log.
func runPrep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("prep", stderr)
	pf := addPreflightFlags(fs)
	gen := fs.Int("generation", 0, "prep generation (cubeNodeBootstrap.prepGeneration), >= 1")
	dir := fs.String("dir", "/var/lib/cube/prep", "directory of the fingerprints")
	runDir := fs.String("run-dir", envDefault("CUBE_RUN_DIR", "/run/cube"), "runtime directory to create (netns pins)")
	node := fs.String("node", os.Getenv("NODE_NAME"), "node name recorded in the fingerprint (env NODE_NAME)")
	hold := fs.Bool("hold", false, "after writing the fingerprint, wait until terminated")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *gen < 1 || fs.NArg() > 0 {
		return usageError{"usage: cube prep --generation N [--dir DIR] [preflight flags]"}
	}
	rep, facts, err := runPreflightChecks(ctx, pf, stdout)
	if err != nil {
		if len(rep.Results) > 0 && !rep.Passed {
			recordPrepFailure(stderr, *dir, preflight.NewFailure(*gen, *node, version.Version, rep, time.Now()))
		}
		return err
	}
	for _, d := range []string{*dir, filepath.Join(*runDir, "netns")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("prep: %w", err)
		}
	}
	fp, err := preflight.NewFingerprint(*gen, *node, version.Version, facts.Kernel, rep, time.Now())
	if err != nil {
		return err
	}
	if err := preflight.WriteFingerprint(*dir, fp); err != nil {
		return err
	}
	if err := preflight.ClearFailure(*dir, *gen); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "node prepared: %s\n", preflight.FingerprintPath(*dir, *gen))
	if *hold {
		<-ctx.Done()
	}
	return nil
}

// recordPrepFailure writes <dir>/<generation>.failed, which the node's
// cubelet reports to the server (helm test reads it there). Best effort:
// the failed checks are the error that matters.
func recordPrepFailure(stderr io.Writer, dir string, f preflight.Failure) {
	if err := preflight.WriteFailure(dir, f); err != nil {
		fmt.Fprintf(stderr, "cube prep: %v\n", err)
	}
}

// kubeVerbs are the verbs of `cube kube`.
const kubeVerbs = "hostnet-preflight|wait-prep|install-artifacts|share-mounts|stop-cubelet|node-controller|release-nodes"

// runKube is `cube kube ...`: the commands the Helm chart's Pods run.
func runKube(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const verbs = kubeVerbs
	if len(args) == 0 {
		return usageError{"usage: cube kube " + verbs + " ..."}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, "usage: cube kube "+verbs+" [flags] (the commands the Helm chart's Pods run; see docs/kubernetes/)")
		return nil
	}
	fs := newFlagSet("kube "+args[0], stderr)
	switch args[0] {
	case "hostnet-preflight":
		ns := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace of the DaemonSet (env POD_NAMESPACE)")
		name := fs.String("daemonset", "cube-node", "DaemonSet name")
		desired := fs.Bool("desired", true, "hostNetwork value of the release being applied")
		ack := fs.Bool("ack", false, "cubeNode.hostNetworkChangeAck")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		if *ns == "" {
			return usageError{"--namespace is required"}
		}
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return fmt.Errorf("hostnet preflight: in-cluster config: %v: %w", err, errdefs.ErrUnavailable)
		}
		k, err := hostnetgate.NewKube(cfg)
		if err != nil {
			return err
		}
		d, err := hostnetgate.Run(ctx, k, *ns, *name, *desired, *ack)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, d.Message)
		return nil
	case "wait-prep":
		genFile := fs.String("generation-file", "/etc/cube/prep/generation", "file holding the current prep generation (a ConfigMap key)")
		dir := fs.String("dir", "/var/lib/cube/prep", "directory of the fingerprints")
		var require stringList
		fs.Var(&require, "require", "a file that must exist too (e.g. the installed envd); repeatable")
		timeout := fs.Duration("timeout", 0, "give up after this long (0: wait forever)")
		every := fs.Duration("interval", 2*time.Second, "poll interval")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		return waitPrep(ctx, stdout, *genFile, *dir, require, *timeout, *every)
	case "install-artifacts":
		from := fs.String("from", "/opt/cube/artifacts", "artifacts in the installer image")
		to := fs.String("to", "/var/lib/cube/artifacts", "host directory cubelet reads them from")
		hold := fs.Bool("hold", false, "after installing, wait until terminated")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		arts, changed, err := preflight.InstallArtifacts(*from, *to)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "installed %d artifacts into %s (%d changed)\n", len(arts), *to, changed)
		if *hold {
			<-ctx.Done()
		}
		return nil
	case "share-mounts":
		var dirs stringList
		fs.Var(&dirs, "dir", "host directory that must lie on a shared mount (created if missing); repeatable")
		here := fs.Bool("here", false, "work in this process's own mount namespace (on the host itself); default: find the host's from a hostPID Pod")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		if len(dirs) == 0 || fs.NArg() > 0 {
			return usageError{"usage: cube kube share-mounts --dir DIR [--dir DIR ...] [--here]"}
		}
		return shareMounts(ctx, stdout, stderr, dirs, *here)
	case "stop-cubelet":
		timeout := fs.Duration("timeout", 25*time.Second, "how long to wait for cubelet to exit")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		return stopCubelet(ctx, stdout, "/proc", *timeout)
	default:
		return usageError{fmt.Sprintf("unknown kube command %q (%s)", args[0], strings.ReplaceAll(verbs, "|", ", "))}
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

func waitPrep(ctx context.Context, stdout io.Writer, genFile, dir string, require []string, timeout, every time.Duration) error {
	gen, err := preflight.ReadGeneration(genFile)
	if err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	fmt.Fprintf(stdout, "waiting for %s\n", preflight.FingerprintPath(dir, gen))
	fp, err := preflight.WaitFingerprint(ctx, dir, gen, every)
	if err != nil {
		return err
	}
	for _, p := range require {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s (is cube-node-installer running on this node?): %w", p, errdefs.ErrUnavailable)
			case <-time.After(every):
			}
		}
	}
	fmt.Fprintf(stdout, "node prep generation %d ready (runtime %s, %d warnings)\n", fp.Generation, fp.Runtime, len(fp.Warnings))
	return nil
}

// proc is what stopCubelet knows of a process.
type proc struct {
	pid   int
	argv  []string
	mntNS string
}

// cubeletTargets picks the processes a preStop may signal: `cube cubelet`
// in the caller's own mount namespace (its container), never itself, never
// a shim or a sandbox (other argv or other namespaces).
func cubeletTargets(procs []proc, self int, selfMntNS string) []int {
	var out []int
	for _, p := range procs {
		if p.pid == self || p.mntNS != selfMntNS || len(p.argv) < 2 {
			continue
		}
		if filepath.Base(p.argv[0]) == "cube" && p.argv[1] == "cubelet" {
			out = append(out, p.pid)
		}
	}
	return out
}

func listProcs(procDir string) []proc {
	ents, _ := os.ReadDir(procDir)
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join(procDir, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join(procDir, e.Name(), "ns", "mnt"))
		if err != nil {
			continue
		}
		out = append(out, proc{pid: pid, argv: strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00"), mntNS: ns})
	}
	return out
}

// stopCubelet sends SIGTERM to cubelet only (by pid, not to a process
// group) and waits for it to exit. Shims and sandboxes are not touched.
func stopCubelet(ctx context.Context, stdout io.Writer, procDir string, timeout time.Duration) error {
	self, err := os.Readlink(filepath.Join(procDir, "self", "ns", "mnt"))
	if err != nil {
		return fmt.Errorf("stop cubelet: %w", err)
	}
	pids := cubeletTargets(listProcs(procDir), os.Getpid(), self)
	if len(pids) == 0 {
		fmt.Fprintln(stdout, "no cubelet running in this container")
		return nil
	}
	return terminate(ctx, stdout, procDir, pids, timeout)
}

// terminate sends SIGTERM to each pid and waits until all have exited.
func terminate(ctx context.Context, stdout io.Writer, procDir string, pids []int, timeout time.Duration) error {
	for _, pid := range pids {
		if err := unix.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("stop cubelet: signal %d: %w", pid, err)
		}
		fmt.Fprintf(stdout, "sent SIGTERM to cubelet pid %d\n", pid)
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for unix.Kill(pid, 0) == nil && !isZombie(procDir, pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("stop cubelet: pid %d still running after %s: %w", pid, timeout, errdefs.ErrUnavailable)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func isZombie(procDir string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(rest, "Z")
}

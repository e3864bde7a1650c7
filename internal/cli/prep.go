package cli

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/nodeops"
	"github.com/cube-dev/cube/internal/preflight"
)

// preflightFlags are the flags `cube preflight` and `cube prep` share.
type preflightFlags struct {
	opts   nodeops.PreflightOptions
	asJSON bool
}

func addPreflightFlags(fs *pflag.FlagSet) *preflightFlags {
	f := &preflightFlags{opts: nodeops.PreflightOptions{Config: preflight.DefaultConfig()}}
	cfg := &f.opts.Config
	cfg.NodePortMin, cfg.NodePortMax = 0, 0 // not checked unless --nodeport-range
	fs.BoolVar(&cfg.Strict, "strict", false, "treat warnings (CNI, kube-proxy, route overlaps) as failures")
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	addNodeCIDRFlag(fs, &cfg.NodeCIDR, "sandbox address range of this node")
	fs.Var(prefixListValue{&cfg.ServiceCIDRs}, "service-cidr", "Kubernetes Service CIDRs, comma-separated")
	fs.Var(prefixListValue{&cfg.PodCIDRs}, "pod-cidr", "Kubernetes Pod CIDRs, comma-separated")
	fs.Var(portRangeValue{&cfg.PortMin, &cfg.PortMax}, "port-range", "host ports mapped to sandboxes")
	bindEnv(fs, "port-range", "CUBE_PORT_RANGE")
	fs.Var(portRangeValue{&cfg.NodePortMin, &cfg.NodePortMax}, "nodeport-range", "Kubernetes NodePort range MIN-MAX (e.g. 30000-32767; empty: not checked)")
	fs.StringVar(&cfg.Runtime, "runtime", "auto", "sandbox runtime: auto (vm where /dev/kvm exists), ns or vm")
	fs.StringVar(&cfg.ServerURL, "server", "", "Cube server URL to probe with GET /health (empty: not checked)")
	fs.StringVar(&f.opts.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory of the host")
	return f
}

func (f *preflightFlags) options() nodeops.PreflightOptions {
	o := f.opts
	o.Format = format(f.asJSON)
	return o
}

// newPreflightCmd is `cube preflight`: exit 0 when the host passes, 1 when
// a check fails (or warns, with --strict), 2 on bad flags.
func newPreflightCmd() *cobra.Command {
	var pf *preflightFlags
	c := &cobra.Command{
		Use:   "preflight",
		Short: "check that this host can run a Cube node (exit 1 on failure)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, _, err := nodeops.Preflight(cmd.Context(), pf.options(), cmd.OutOrStdout())
			return err
		},
	}
	pf = addPreflightFlags(c.Flags())
	return c
}

// newPrepCmd is `cube prep`: preflight, node preparation, then the
// fingerprint (see nodeops.Prep). With --hold it then waits for a signal,
// so a DaemonSet Pod stays Running with the report in its log.
func newPrepCmd() *cobra.Command {
	var pf *preflightFlags
	var opts nodeops.PrepOptions
	var hold bool
	const usage = "usage: cube prep --generation N [--dir DIR] [preflight flags]"
	c := &cobra.Command{
		Use:   "prep --generation N",
		Short: "preflight, then prepare the node and write the prep fingerprint",
		Args:  exactArgs(0, usage),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Generation < 1 {
				return usageError{usage}
			}
			opts.Preflight = pf.options()
			if err := nodeops.Prep(cmd.Context(), opts, cmd.OutOrStdout(), cmd.ErrOrStderr()); err != nil {
				return err
			}
			if hold {
				<-cmd.Context().Done()
			}
			return nil
		},
	}
	fs := c.Flags()
	pf = addPreflightFlags(fs)
	fs.IntVar(&opts.Generation, "generation", 0, "prep generation (cubeNodeBootstrap.prepGeneration), >= 1")
	fs.StringVar(&opts.Dir, "dir", "/var/lib/cube/prep", "directory of the fingerprints")
	fs.StringVar(&opts.RunDir, "run-dir", "/run/cube", "runtime directory to create (netns pins)")
	bindEnv(fs, "run-dir", "CUBE_RUN_DIR")
	fs.StringVar(&opts.Node, "node", "", "node name recorded in the fingerprint")
	bindEnv(fs, "node", "NODE_NAME")
	fs.BoolVar(&hold, "hold", false, "after writing the fingerprint, wait until terminated")
	return c
}

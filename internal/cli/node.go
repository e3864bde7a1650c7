package cli

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nodeops"
)

func newNodeCmd() *cobra.Command {
	return group("node", "inspect and repair this machine's node (mapdump, doctor, gc, cleanup); administer a server's nodes",
		// Local verbs: this machine's node state, selected by --data-dir.
		newNodeMapdumpCmd(), newNodeDoctorCmd(), newNodeGCCmd(), newNodeCleanupCmd(),
		// Cluster verbs: a server's node API (--server URL --api-key KEY).
		newNodeAdminCmd("ls", "list the server's nodes with state, version, load and health (--json)"),
		newNodeCheckHealthCmd(),
		newNodeAdminCmd("isolate", "stop scheduling onto a node (its sandboxes keep running)"),
		newNodeAdminCmd("uncordon", "make an isolated or drained node schedulable again"),
		newNodeAdminCmd("drain", "isolate a node, wait --grace, then kill its sandboxes or wait for their TTLs (--policy)"),
		newNodeAdminCmd("delete", "deregister an isolated, empty node (--force: any node)"),
	)
}

// localNode are the flags that locate a node's state on this machine; they
// mirror `cube up`'s so the same values select the same node.
type localNode struct {
	dataDir, runDir, envd, cgroupParent string
	logLevel                            slog.Level
	network                             cubevs.Config
}

func addLocalNodeFlags(fs *pflag.FlagSet) *localNode {
	n := &localNode{network: cubevs.DefaultConfig()}
	fs.SortFlags = false
	fs.StringVar(&n.dataDir, "data-dir", "/var/lib/cube", "data directory of the node")
	bindEnv(fs, "data-dir", "CUBE_DATA_DIR")
	fs.StringVar(&n.runDir, "run-dir", "/run/cube", "runtime directory of the node")
	bindEnv(fs, "run-dir", "CUBE_RUN_DIR")
	fs.StringVar(&n.envd, "envd", "", "path of the envd binary (default: next to the cube binary)")
	bindEnv(fs, "envd", "CUBE_ENVD")
	addNodeCIDRFlag(fs, &n.network.NodeCIDR, "sandbox address range of the node")
	fs.StringVar(&n.cgroupParent, "cgroup-parent", "cube", "cgroup parent of the node's sandboxes")
	bindEnv(fs, "cgroup-parent", "CUBE_CGROUP_PARENT")
	addLogLevel(fs, &n.logLevel, slog.LevelWarn)
	addNetworkFlags(fs, &n.network)
	return n
}

// config is the cubelet configuration of the node the flags select.
func (n *localNode) config(cmd *cobra.Command) (cubelet.Config, error) {
	netw := n.network
	netw.RunDir = n.runDir
	if _, err := resolveHostNetNS(&netw); err != nil {
		return cubelet.Config{}, err
	}
	envd := n.envd
	if envd == "" {
		if exe, err := os.Executable(); err == nil {
			envd = filepath.Join(filepath.Dir(exe), "envd")
		}
	}
	return cubelet.Config{
		StateDir:     filepath.Join(n.dataDir, "node"),
		EnvdPath:     envd,
		CgroupParent: n.cgroupParent,
		Network:      netw,
		Logger:       newLogger(cmd.ErrOrStderr(), n.logLevel),
	}, nil
}

// localNodeCmd is a `cube node` verb that works on this machine's node
// state: run gets the node's configuration.
func localNodeCmd(use, short string, run func(*cobra.Command, cubelet.Config) error) (*cobra.Command, *pflag.FlagSet) {
	var n *localNode
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := n.config(cmd)
			if err != nil {
				return err
			}
			return run(cmd, cfg)
		},
	}
	n = addLocalNodeFlags(c.Flags())
	return c, c.Flags()
}

func format(asJSON bool) nodeops.Format {
	if asJSON {
		return nodeops.JSON
	}
	return nodeops.Text
}

func newNodeMapdumpCmd() *cobra.Command {
	var asJSON bool
	c, fs := localNodeCmd("mapdump", "list host-port mappings with their owners (owned, orphan, conflict)",
		func(cmd *cobra.Command, cfg cubelet.Config) error {
			return nodeops.Mapdump(cmd.Context(), cfg, format(asJSON), cmd.OutOrStdout())
		})
	fs.BoolVar(&asJSON, "json", false, "print JSON (one field per line)")
	return c
}

func newNodeDoctorCmd() *cobra.Command {
	var asJSON bool
	c, fs := localNodeCmd("doctor", "report orphans, dead shims, bad records and preflight problems; exit 1 if any",
		func(cmd *cobra.Command, cfg cubelet.Config) error {
			return nodeops.Doctor(cmd.Context(), cfg, format(asJSON), cmd.OutOrStdout())
		})
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newNodeGCCmd() *cobra.Command {
	c, _ := localNodeCmd("gc", "remove orphans and dead sandboxes (refused while cube runs on the node)",
		func(cmd *cobra.Command, cfg cubelet.Config) error {
			return nodeops.GC(cmd.Context(), cfg, cmd.OutOrStdout())
		})
	return c
}

func newNodeCleanupCmd() *cobra.Command {
	var purge bool
	c, fs := localNodeCmd("cleanup", "uninstall: kill every sandbox, remove the dataplane, cgroups and (--purge-state) node state",
		func(cmd *cobra.Command, cfg cubelet.Config) error {
			return nodeops.Cleanup(cmd.Context(), cfg, purge, cmd.OutOrStdout())
		})
	fs.BoolVar(&purge, "purge-state", false, "also remove the node state dir (<data-dir>/node)")
	return c
}

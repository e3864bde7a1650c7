// Package cli parses Cube's command line and dispatches to the roles. Each
// subcommand lives in its own file; wiring of components happens here and in
// internal/app, never in init().
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
)

// command is one `cube <name>` subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"version":  {"print the version", runVersion},
		"server":   {"run the control plane (api, master, proxy) for remote cubelets", runServer},
		"cubelet":  {"run the node agent and register with a cube server", runCubelet},
		"up":       {"start all-in-one Cube (server + cubelet) on this machine", runUp},
		"down":     {"stop the all-in-one Cube running on a data dir", runDown},
		"template": {"manage templates: create NAME --from-dir DIR | --from-tar FILE, ls, rm", runTemplate},
		"node":     {"inspect and repair this machine's node: mapdump, doctor, gc", runNode},
		"key":      {"manage API keys: create [--name N], ls, revoke ID", runKey},
		"bench":    {"measure a running Cube: create latency (REST, SDK), memory, density, restart, floor", runBench},

		"preflight": {"check that this host can run a Cube node (exit 1 on failure)", runPreflight},
		"prep":      {"preflight, then prepare the node and write the prep fingerprint", runPrep},
		"kube":      {"commands the Helm chart runs: hostnet-preflight, wait-prep, install-artifacts, share-mounts, stop-cubelet, node-controller, release-nodes", runKubeAll},
	}
}

// Run executes `cube args...` and returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout, cmds)
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "cube: unknown command %q\n\n", args[0])
		usage(stderr, cmds)
		return 2
	}
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "cube %s: %v\n", args[0], err)
			return 2
		}
		fmt.Fprintf(stderr, "cube %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: cube <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		if cmds[n].summary != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].summary)
	}
}

// usageError marks errors caused by bad command-line input (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// parseFlags parses args into fs: a bad flag or value is a usage error (exit
// code 2), -h/--help is flag.ErrHelp (exit code 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{err.Error()}
	}
	return err
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("cube "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// envInt returns the environment variable as an int, or def.
func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

// envBool returns the environment variable as a bool, or def.
func envBool(key string, def bool) bool {
	if v, err := strconv.ParseBool(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

// envDefault returns the environment variable's value or def.
func envDefault(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	switch strings.ToLower(level) {
	case "debug":
		l = slog.LevelDebug
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

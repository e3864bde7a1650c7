// Package cli is Cube's command line: cobra commands that turn flags (with
// environment variables as their defaults, see env.go) into configuration
// and call the roles in internal/roles and the operations of other packages
// (internal/nodeops for work on a node outside its cubelet). Wiring is
// written out here and in internal/roles, never in init().
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/roles"
)

// runners start the long-running roles commands end in. Tests replace them to
// see the configuration a command would start with, without starting it.
type runners struct {
	allInOne func(context.Context, roles.AllInOneConfig) error
	server   func(context.Context, roles.ServerConfig) error
	cubelet  func(context.Context, roles.CubeletConfig) error
}

func defaultRunners() runners {
	return runners{allInOne: roles.RunAllInOne, server: roles.RunServer, cubelet: roles.RunCubelet}
}

// Run executes `cube args...` and returns the process exit code: 0 on
// success and for help, 1 when the command failed, 2 for a bad command line
// (unknown command or flag, a malformed flag value or environment
// variable, missing or extra arguments).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, stdout, stderr, defaultRunners())
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, r runners) int {
	root := newRoot(stdout, stderr, r)
	root.SetArgs(normaliseArgs(root, args))
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	name := "cube"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", name)
		return 2
	}
	return 1
}

func newRoot(stdout, stderr io.Writer, r runners) *cobra.Command {
	root := &cobra.Command{
		Use:   "cube",
		Short: "Cube: an E2B-compatible sandbox platform in one binary",
		Long: `Cube runs E2B-compatible sandboxes. One binary holds every role: all-in-one
(cube up), the control plane (cube server), the node agent (cube cubelet), and
the operator's and the Helm chart's tools.

Flags that have an environment variable say so in their help ("env CUBE_..."):
a flag on the command line beats the variable, which beats the default; a
malformed value in either is an error.`,
		Args:              cobra.ArbitraryArgs,
		RunE:              groupRunE,
		SilenceErrors:     true,
		SilenceUsage:      true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return applyEnv(cmd) },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	root.AddCommand(
		newVersionCmd(),
		newUpCmd(r), newDownCmd(),
		newServerCmd(r), newCubeletCmd(r),
		newTemplateCmd(), newKeyCmd(), newNodeCmd(),
		newBenchCmd(),
		newPreflightCmd(), newPrepCmd(), newKubeCmd(),
	)
	addCompletions(root)
	return root
}

// group returns a command that only holds verbs: `cube node` alone or with
// an unknown verb is a usage error listing the verbs.
func group(use, short string, verbs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Args: cobra.ArbitraryArgs, RunE: groupRunE, SuggestionsMinimumDistance: 2}
	c.AddCommand(verbs...)
	return c
}

// groupRunE runs for a command that holds subcommands when none was named:
// help without arguments for the root (as before), else a usage error.
func groupRunE(cmd *cobra.Command, args []string) error {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() && c.Name() != "help" && c.Name() != "completion" {
			names = append(names, c.Name())
		}
	}
	if len(args) > 0 && args[0] == "help" { // `cube node help`, as before
		return cmd.Help()
	}
	if len(args) == 0 {
		if !cmd.HasParent() {
			return cmd.Help()
		}
		return usageError{fmt.Sprintf("missing command: one of %s", strings.Join(names, ", "))}
	}
	msg := fmt.Sprintf("unknown command %q (one of %s)", args[0], strings.Join(names, ", "))
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{msg}
}

// usageError marks errors caused by bad command-line input (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// noArgs rejects positional arguments.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %v", args)}
	}
	return nil
}

// exactArgs wants n positional arguments; usage says what they are.
func exactArgs(n int, usage string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{usage}
		}
		return nil
	}
}

// normaliseArgs rewrites single-dash long flags (-listen, -data-dir=x),
// which Go's flag package accepted and earlier versions of cube parsed, to
// the double-dash form pflag wants. Only names of the command's own flags
// are rewritten (and help); single-letter shorthands, values such as -1
// and everything after "--" are left alone.
func normaliseArgs(root *cobra.Command, args []string) []string {
	if len(args) > 0 && strings.HasPrefix(args[0], "__complete") {
		return args
	}
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		return args
	}
	out := make([]string, len(args))
	copy(out, args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if name == "help" || cmd.Flags().Lookup(name) != nil || cmd.InheritedFlags().Lookup(name) != nil {
			out[i] = "-" + a
		}
	}
	return out
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

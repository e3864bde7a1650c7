package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// runCube runs `cube args...` with the real roles and returns the exit
// code and outputs. Only commands that fail before starting a role, or
// that start none, may be run this way.
func runCube(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// Bad command lines exit 2 with the reason on stderr; help exits 0.
func TestExitCodes(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     string
		stderrWant string
	}{
		{args: []string{"nope"}, code: 2, stderrWant: `unknown command "nope"`},
		{args: []string{"node", "ls", "--bogus"}, code: 2, stderrWant: "unknown flag: --bogus"},
		{args: []string{"template", "ls", "--bogus"}, code: 2, stderrWant: "--bogus"},
		{args: []string{"key", "create", "--bogus"}, code: 2, stderrWant: "--bogus"},
		{args: []string{"kube", "wait-prep", "--timeout=soon"}, code: 2, stderrWant: "invalid argument"},
		{args: []string{"kube", "frobnicate"}, code: 2, stderrWant: "node-controller"},
		{args: []string{"kube"}, code: 2, stderrWant: "release-nodes"},
		{args: []string{"node"}, code: 2, stderrWant: "doctor"},
		{args: []string{"up", "--create-rate-limit", "fast"}, code: 2, stderrWant: "RATE[:BURST]"},
		{args: []string{"server", "--api-rate-limit=10:0"}, code: 2, stderrWant: "burst"},
		{args: []string{"server", "--roles", "api,dns"}, code: 2, stderrWant: `unknown role "dns"`},
		{args: []string{"up", "--node-cidr", "nope"}, code: 2, stderrWant: "--node-cidr"},
		{args: []string{"up", "--port-range", "9-3"}, code: 2, stderrWant: "want MIN-MAX"},
		{args: []string{"up", "--log-level", "loud"}, code: 2, stderrWant: "debug, info, warn, error"},
		{args: []string{"up", "extra"}, code: 2, stderrWant: "unexpected arguments [extra]"},
		{args: []string{"cubelet"}, code: 2, stderrWant: "--server and --node-id are required"},
		{args: []string{"kube", "--help"}, code: 0, stdout: "node-controller"},
		{args: []string{"kube", "--help"}, code: 0, stdout: "release-nodes"},
		{args: []string{"kube", "release-nodes", "--node-selector="}, code: 2, stderrWant: "selects every Node"},
		{args: []string{"kube", "release-nodes", "--node-selector=a in ("}, code: 2, stderrWant: "--node-selector"},
		{args: []string{"kube", "release-nodes", "extra"}, code: 2, stderrWant: "usage: cube kube release-nodes"},
		{args: []string{"kube", "share-mounts"}, code: 2, stderrWant: "usage: cube kube share-mounts"},
		{args: []string{"node", "isolate"}, code: 2, stderrWant: "usage: cube node isolate NODE"},
		{args: []string{"template", "create", "x"}, code: 2, stderrWant: "--from-dir DIR | --from-tar FILE"},
		{args: []string{"prep"}, code: 2, stderrWant: "usage: cube prep --generation N"},
		{args: []string{"node", "ls", "-h"}, code: 0, stdout: "--server"},
		{args: []string{"--help"}, code: 0, stdout: "Available Commands"},
		{args: []string{}, code: 0, stdout: "Available Commands"},
		{args: []string{"help", "node"}, code: 0, stdout: "mapdump"},
		{args: []string{"node", "help"}, code: 0, stdout: "mapdump"},
		{args: []string{"version"}, code: 0, stdout: "cube "},
		// Single-dash long flags, which Go's flag package took, still parse.
		{args: []string{"up", "-pool-size", "x"}, code: 2, stderrWant: `"--pool-size"`},
		{args: []string{"up", "--pool-size", "-2"}, code: 2, stderrWant: "or auto"},
		{args: []string{"cubelet", "--pool-size", "lots"}, code: 2, stderrWant: "or auto"},
		{args: []string{"cubelet", "--cpu-overcommit", "x"}, code: 2, stderrWant: "--cpu-overcommit"},
		{args: []string{"up", "-log-level=loud"}, code: 2, stderrWant: "debug, info, warn, error"},
		{args: []string{"node", "ls", "-help"}, code: 0, stdout: "--server"},
	} {
		code, out, errOut := runCube(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.stderrWant) || !strings.Contains(out, tc.stdout) {
			t.Errorf("cube %s: exit %d, stdout %q, stderr %q; want exit %d, stdout containing %q, stderr containing %q",
				strings.Join(tc.args, " "), code, out, errOut, tc.code, tc.stdout, tc.stderrWant)
		}
	}
}

// allCommands lists every command of the tree, root first.
func allCommands(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		out = append(out, allCommands(sub)...)
	}
	return out
}

// TestHelpEveryCommand: `--help` works on every command, exits 0, shows
// usage and names the environment variable of every bound flag.
func TestHelpEveryCommand(t *testing.T) {
	clearEnv(t)
	root := newRoot(nil, nil, runners{})
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	n := 0
	for _, c := range allCommands(root) {
		if c.Hidden {
			continue
		}
		path := strings.Fields(c.CommandPath())[1:]
		code, out, errOut := runCube(t, append(path, "--help")...)
		about := c.Long // help starts with Long, else Short
		if about == "" {
			about = c.Short
		}
		about, _, _ = strings.Cut(about, "\n")
		if code != 0 || errOut != "" || !strings.Contains(out, "Usage:") || !strings.Contains(out, about) {
			t.Errorf("cube %s --help: exit %d, stderr %q, stdout %q", strings.Join(path, " "), code, errOut, out)
			continue
		}
		n++
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			for _, env := range f.Annotations[envAnnotation] {
				if !f.Hidden && !strings.Contains(out, env) {
					t.Errorf("cube %s --help does not name %s (flag --%s)", strings.Join(path, " "), env, f.Name)
				}
			}
		})
	}
	if n < 30 {
		t.Errorf("help checked on %d commands, want every command (30+)", n)
	}
}

// TestCompletion: the shells' completion scripts are generated, and the
// completion they call answers with the command tree.
func TestCompletion(t *testing.T) {
	clearEnv(t)
	for shell, want := range map[string]string{"bash": "__start_cube", "zsh": "#compdef cube", "fish": "complete -c cube"} {
		code, out, errOut := runCube(t, "completion", shell)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, stderr %q, %d bytes without %q", shell, code, errOut, len(out), want)
		}
	}
	code, out, _ := runCube(t, "__complete", "node", "")
	if code != 0 || !strings.Contains(out, "doctor") || !strings.Contains(out, "cleanup") {
		t.Errorf("__complete node: exit %d\n%s", code, out)
	}
	code, out, _ = runCube(t, "__complete", "node", "doctor", "--log-level", "")
	if code != 0 || !strings.Contains(out, "warn") || strings.Contains(out, "doctor") {
		t.Errorf("__complete node doctor --log-level: exit %d\n%s", code, out)
	}
	code, out, _ = runCube(t, "__complete", "up", "--pool")
	if code != 0 || !strings.Contains(out, "--pool-size") {
		t.Errorf("__complete up --pool: exit %d\n%s", code, out)
	}
}

func TestNormaliseArgs(t *testing.T) {
	root := newRoot(nil, nil, runners{})
	for _, tc := range []struct{ in, want []string }{
		{[]string{"up", "-listen", "x", "-data-dir=/d", "-h"}, []string{"up", "--listen", "x", "--data-dir=/d", "-h"}},
		{[]string{"up", "--create-parallelism", "-1"}, []string{"up", "--create-parallelism", "-1"}},
		{[]string{"node", "drain", "-policy", "wait", "n1", "--", "-json"}, []string{"node", "drain", "--policy", "wait", "n1", "--", "-json"}},
		{[]string{"template", "create", "-nope"}, []string{"template", "create", "-nope"}},
		{[]string{"key", "ls", "-help"}, []string{"key", "ls", "--help"}},
	} {
		if got := normaliseArgs(root, tc.in); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("normaliseArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

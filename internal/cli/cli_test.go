package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// Bad command lines exit 2 with the reason on stderr; help exits 0.
func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     string
		stderrWant string
	}{
		{args: []string{"nope"}, code: 2, stderrWant: `unknown command "nope"`},
		{args: []string{"node", "ls", "--bogus"}, code: 2, stderrWant: "flag provided but not defined: -bogus"},
		{args: []string{"template", "ls", "--bogus"}, code: 2, stderrWant: "-bogus"},
		{args: []string{"key", "create", "--bogus"}, code: 2, stderrWant: "-bogus"},
		{args: []string{"kube", "wait-prep", "--timeout=soon"}, code: 2, stderrWant: "invalid value"},
		{args: []string{"kube", "frobnicate"}, code: 2, stderrWant: "node-controller"},
		{args: []string{"up", "--create-rate-limit", "fast"}, code: 2, stderrWant: "RATE[:BURST]"},
		{args: []string{"server", "--api-rate-limit=10:0"}, code: 2, stderrWant: "burst"},
		{args: []string{"kube", "--help"}, code: 0, stdout: "node-controller"},
		{args: []string{"kube", "--help"}, code: 0, stdout: "release-nodes"},
		{args: []string{"kube", "release-nodes", "--node-selector="}, code: 2, stderrWant: "selects every Node"},
		{args: []string{"kube", "release-nodes", "--node-selector=a in ("}, code: 2, stderrWant: "--node-selector"},
		{args: []string{"kube", "release-nodes", "extra"}, code: 2, stderrWant: "usage: cube kube release-nodes"},
		{args: []string{"node", "ls", "-h"}, code: 0},
		{args: []string{"--help"}, code: 0, stdout: "commands:"},
	} {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.stderrWant) || !strings.Contains(out.String(), tc.stdout) {
			t.Errorf("cube %s: exit %d, stdout %q, stderr %q; want exit %d, stdout containing %q, stderr containing %q",
				strings.Join(tc.args, " "), code, out.String(), errOut.String(), tc.code, tc.stdout, tc.stderrWant)
		}
	}
}

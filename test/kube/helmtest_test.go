package kube

import (
	"strings"
	"testing"
)

// helmTestScript returns the bash script of a helm test Job.
func helmTestScript(t *testing.T, objs []Object, name string) string {
	t.Helper()
	job := get(t, objs, "Job", name)
	if h := dig(job.Doc, "metadata", "annotations", "helm.sh/hook"); h != "test" {
		t.Fatalf("%s: helm.sh/hook %v, want test", name, h)
	}
	cs, _ := dig(job.Doc, "spec", "template", "spec", "containers").([]any)
	if len(cs) != 1 {
		t.Fatalf("%s: %d containers", name, len(cs))
	}
	args, _ := dig(cs[0], "args").([]any)
	if len(args) != 1 {
		t.Fatalf("%s: args %v", name, args)
	}
	return args[0].(string)
}

// TestNodeHealthHelmTest: the third helm test checks every Ready node's
// socket and its preflight fingerprint of the chart's prep generation;
// only the socket when the bootstrap is disabled; absent without the
// control plane.
func TestNodeHealthHelmTest(t *testing.T) {
	cases := []struct{ values, want string }{
		{"", "cube node check-health --prep-generation=1 "},
		{"cubeNodeBootstrap: {prepGeneration: 7}", "cube node check-health --prep-generation=7 "},
		{"cubeNodeBootstrap: {enabled: false, prepGeneration: 7}", "cube node check-health --prep-generation=0 "},
		{"tests: {nodeReadyTimeoutSeconds: 30}", "timeout=30\n"},
	}
	for _, c := range cases {
		script := helmTestScript(t, render(t, c.values), "cube-test-node-health")
		if !strings.Contains(script, c.want) {
			t.Errorf("values %q: script lacks %q:\n%s", c.values, c.want, script)
		}
	}
	for _, o := range render(t, computeOnly) {
		if o.Kind() == "Job" && strings.HasPrefix(o.Name(), "cube-test-") {
			t.Errorf("compute-only release renders helm test %s", o.Name())
		}
	}
}

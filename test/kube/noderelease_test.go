package kube

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// releaseHook are the objects of the pre-delete hook cube-node-release
// with their hook weights: RBAC before the Job.
var releaseHook = []struct{ kind, name, weight string }{
	{"ServiceAccount", "cube-node-release", "-10"},
	{"ClusterRole", "cube-system-cube-node-release", "-10"},
	{"Role", "cube-node-release", "-10"},
	{"ClusterRoleBinding", "cube-system-cube-node-release", "-9"},
	{"RoleBinding", "cube-node-release", "-9"},
	{"Job", "cube-node-release", "0"},
}

// The release hook is rendered with the node controller, in both release
// profiles, as a pre-delete hook whose RBAC exists before its Job; it stops
// the controller's Deployment, then releases the controller's Nodes.
func TestNodeReleaseHookRendered(t *testing.T) {
	for name, tc := range map[string]struct{ vals, selector string }{
		"default":      {"", "--node-selector=cube.dev/compute=true"},
		"compute-only": {computeOnly, "--node-selector=cube.dev/compute=true"},
		"own selector": {"nodeController: {nodeSelector: 'pool=cube,tier!=edge'}", "--node-selector=pool=cube,tier!=edge"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, tc.vals)
			for _, h := range releaseHook {
				o := get(t, objs, h.kind, h.name)
				a, _ := dig(o.Doc, "metadata", "annotations").(map[string]any)
				if a["helm.sh/hook"] != "pre-delete" || a["helm.sh/hook-weight"] != h.weight ||
					a["helm.sh/hook-delete-policy"] != "before-hook-creation,hook-succeeded" {
					t.Errorf("%s %s: hook annotations %v, want pre-delete, weight %s, before-hook-creation,hook-succeeded", h.kind, h.name, a, h.weight)
				}
			}
			var job batchv1.Job
			if err := yaml.Unmarshal(get(t, objs, "Job", "cube-node-release").Raw, &job); err != nil {
				t.Fatal(err)
			}
			spec := job.Spec.Template.Spec
			if spec.ServiceAccountName != "cube-node-release" || len(spec.Containers) != 1 {
				t.Fatalf("Job: serviceAccount %q, %d containers", spec.ServiceAccountName, len(spec.Containers))
			}
			c := spec.Containers[0]
			args := strings.Join(c.Args, " ")
			for _, want := range []string{"kube release-nodes", tc.selector, "--stop-deployment=cube-node-controller", "--namespace=cube-system"} {
				if !strings.Contains(args, want) {
					t.Errorf("Job args %q lack %q", args, want)
				}
			}
			if strings.Contains(args, "--server") || len(c.Env) != 0 || len(c.EnvFrom) != 0 {
				t.Errorf("Job talks to Cube's server or reads the API key: args %q, env %v", args, c.Env)
			}
			ctrl := dig(get(t, objs, "Deployment", "cube-node-controller").Doc, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
			if c.Image != ctrl["image"] {
				t.Errorf("Job image %s, node controller image %v", c.Image, ctrl["image"])
			}
			if c.SecurityContext == nil || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
				t.Errorf("Job container may escalate privileges: %+v", c.SecurityContext)
			}
			if job.Spec.ActiveDeadlineSeconds == nil || *job.Spec.ActiveDeadlineSeconds >= 300 {
				t.Errorf("Job activeDeadlineSeconds %v: want below helm's default --timeout (300 s)", job.Spec.ActiveDeadlineSeconds)
			}
		})
	}
}

// The hook's rights are exactly what release-nodes uses: Nodes get, list,
// patch, update and nodes/status patch (cluster-wide); get and delete of
// the cube-node-controller Deployment only (its namespace).
func TestNodeReleaseHookRBACIsMinimal(t *testing.T) {
	objs := render(t, "")
	var cr rbacv1.ClusterRole
	if err := yaml.Unmarshal(get(t, objs, "ClusterRole", "cube-system-cube-node-release").Raw, &cr); err != nil {
		t.Fatal(err)
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "patch", "update"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	}
	if !rulesEqual(cr.Rules, want) {
		t.Errorf("ClusterRole rules = %+v, want %+v", cr.Rules, want)
	}
	var role rbacv1.Role
	if err := yaml.Unmarshal(get(t, objs, "Role", "cube-node-release").Raw, &role); err != nil {
		t.Fatal(err)
	}
	want = []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments"},
		ResourceNames: []string{"cube-node-controller"}, Verbs: []string{"get", "delete"}}}
	if !rulesEqual(role.Rules, want) {
		t.Errorf("Role rules = %+v, want %+v", role.Rules, want)
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		name := "cube-node-release"
		if kind == "ClusterRoleBinding" {
			name = "cube-system-cube-node-release"
		}
		var b rbacv1.RoleBinding // same shape as a ClusterRoleBinding
		if err := yaml.Unmarshal(get(t, objs, kind, name).Raw, &b); err != nil {
			t.Fatal(err)
		}
		if b.RoleRef.Name != name || len(b.Subjects) != 1 || b.Subjects[0].Name != "cube-node-release" || b.Subjects[0].Namespace != "cube-system" {
			t.Errorf("%s %s: roleRef %+v, subjects %+v", kind, name, b.RoleRef, b.Subjects)
		}
	}
}

func TestNodeReleaseHookAbsentWithoutController(t *testing.T) {
	for _, o := range render(t, "nodeController: {enabled: false}") {
		if strings.Contains(o.Name(), "node-release") {
			t.Errorf("disabled node controller renders %s %s", o.Kind(), o.Name())
		}
	}
}

// Adding the release hook changed no Big Pod: the cube-node Pod template
// rendered from the chart without the hook's template file is byte for
// byte the one rendered with it, with the controller on and off.
func TestNodeReleaseHookKeepsBigPodTemplate(t *testing.T) {
	without := t.TempDir()
	if err := os.CopyFS(without, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(without, "templates", "hook-node-release.yaml")
	if _, err := os.Stat(hook); err != nil {
		t.Fatalf("chart has no release hook template: %v", err)
	}
	if err := os.Remove(hook); err != nil {
		t.Fatal(err)
	}
	for _, vals := range []string{"", computeOnly, "nodeController: {enabled: false}"} {
		objs, err := Render(without, vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if strings.Contains(o.Name(), "node-release") {
				t.Fatalf("chart copy still renders %s %s", o.Kind(), o.Name())
			}
		}
		if got, base := nodeTemplate(t, render(t, vals)), nodeTemplate(t, objs); !bytes.Equal(got, base) {
			t.Errorf("values %q: the release hook changed the cube-node Pod template:\nwithout %s\nwith    %s", vals, base, got)
		}
	}
}

// rulesEqual compares policy rules, ignoring the order of the rules.
func rulesEqual(got, want []rbacv1.PolicyRule) bool {
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g rbacv1.PolicyRule) bool {
			return slices.Equal(g.APIGroups, w.APIGroups) && slices.Equal(g.Resources, w.Resources) &&
				slices.Equal(g.ResourceNames, w.ResourceNames) && slices.Equal(g.Verbs, w.Verbs) && len(g.NonResourceURLs) == 0
		}) {
			return false
		}
	}
	return true
}

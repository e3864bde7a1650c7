package kube

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The node controller is on by default, in both release profiles, points at
// the right server, manages the compute pool's Nodes, and holds no more
// rights than it uses.
func TestNodeControllerRendered(t *testing.T) {
	for name, tc := range map[string]struct{ vals, server, selector string }{
		"default":      {"", "--server=http://cube-server.cube-system.svc:3000", "--node-selector=cube.dev/compute=true"},
		"compute-only": {computeOnly, "--server=http://10.1.2.3:3000", "--node-selector=cube.dev/compute=true"},
		"own selector": {"nodeController: {nodeSelector: 'pool=cube,tier!=edge'}", "", "--node-selector=pool=cube,tier!=edge"},
	} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, tc.vals)
			raw := string(get(t, objs, "Deployment", "cube-node-controller").Raw)
			for _, want := range []string{"- node-controller", tc.server, tc.selector, "serviceAccountName: cube-node-controller", "name: POD_NAMESPACE"} {
				if !strings.Contains(raw, want) {
					t.Errorf("Deployment lacks %q:\n%s", want, raw)
				}
			}
			var cr rbacv1.ClusterRole
			if err := yaml.Unmarshal(get(t, objs, "ClusterRole", "cube-system-cube-node-controller").Raw, &cr); err != nil {
				t.Fatal(err)
			}
			// The controller writes its Node conditions (CubeDrain,
			// CubeSchedulable) through the status subresource.
			if !grants(cr, "nodes/status", "patch") {
				t.Errorf("ClusterRole cannot patch nodes/status: %+v", cr.Rules)
			}
			for _, r := range cr.Rules {
				for _, res := range r.Resources {
					if res != "nodes" && res != "nodes/status" && res != "nodes/finalizers" && res != "events" {
						t.Errorf("ClusterRole grants %s", res)
					}
				}
				for _, v := range r.Verbs {
					if v == "delete" || v == "*" || v == "deletecollection" {
						t.Errorf("ClusterRole grants %s on %v", v, r.Resources)
					}
				}
			}
			for _, n := range []string{"ServiceAccount", "Role", "RoleBinding"} {
				get(t, objs, n, "cube-node-controller")
			}
			get(t, objs, "ClusterRoleBinding", "cube-system-cube-node-controller")
		})
	}
}

func TestNodeControllerDisabled(t *testing.T) {
	for _, o := range render(t, "nodeController: {enabled: false}") {
		if strings.Contains(o.Name(), "node-controller") {
			t.Errorf("disabled node controller renders %s %s", o.Kind(), o.Name())
		}
	}
}

// Node controller settings are policy-only: they never recreate a Big Pod.
func TestNodeControllerValuesKeepBigPodTemplate(t *testing.T) {
	base := nodeTemplate(t, render(t, ""))
	for _, vals := range []string{
		"nodeController: {enabled: false}",
		"nodeController: {replicas: 2, logLevel: debug, nodeSelector: 'a=b', resources: {requests: {cpu: 1}}}",
	} {
		if got := nodeTemplate(t, render(t, vals)); !bytes.Equal(got, base) {
			t.Errorf("%s changed the cube-node Pod template", vals)
		}
	}
}

func TestNodeControllerInvalidValues(t *testing.T) {
	for name, vals := range map[string]string{
		"no selector at all": "placement: {compute: {nodeSelector: null}}",
		"bad log level":      "nodeController: {logLevel: loud}",
		"enabled not a bool": "nodeController: {enabled: 'yes'}",
	} {
		if _, err := Render(chartDir, vals); err == nil {
			t.Errorf("%s: rendered without error", name)
		}
	}
}

// grants reports whether a rule of cr allows verb on the core resource res.
func grants(cr rbacv1.ClusterRole, res, verb string) bool {
	for _, r := range cr.Rules {
		if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

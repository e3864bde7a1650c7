package kube

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const chartDir = "../../deploy/kubernetes/chart"

func render(t *testing.T, values string) []Object {
	t.Helper()
	objs, err := Render(chartDir, values)
	if err != nil {
		t.Fatalf("render with %q: %v", values, err)
	}
	return objs
}

func get(t *testing.T, objs []Object, kind, name string) Object {
	t.Helper()
	for _, o := range objs {
		if o.Kind() == kind && o.Name() == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return Object{}
}

func has(objs []Object, kind, name string) bool {
	for _, o := range objs {
		if o.Kind() == kind && o.Name() == name {
			return true
		}
	}
	return false
}

// nodeTemplate returns the canonical JSON bytes of the cube-node Pod
// template: what the DaemonSet controller hashes to decide on a rollout.
func nodeTemplate(t *testing.T, objs []Object) []byte {
	t.Helper()
	b, err := json.Marshal(dig(get(t, objs, "DaemonSet", "cube-node").Doc, "spec", "template"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// policyOnly are value changes that must never recreate a Big Pod.
var policyOnly = map[string]string{
	"ack":                  "cubeNode: {hostNetworkChangeAck: true}",
	"prepGeneration":       "cubeNodeBootstrap: {prepGeneration: 7}",
	"preflight settings":   "cubeNodeBootstrap: {preflight: {strict: true, serviceCIDRs: [10.96.0.0/12], podCIDRs: [10.244.0.0/16], runtime: ns, checkServer: false}}",
	"installer image":      "images: {installer: {repository: example.com/installer, tag: v9}}",
	"nodeInit image":       "images: {nodeInit: {repository: example.com/init, tag: v9}}",
	"bootstrap placement":  "placement: {bootstrap: {nodeSelector: {zone: a}, tolerations: [{key: x, operator: Exists}]}}",
	"bootstrap resources":  "cubeNodeBootstrap: {resources: {requests: {cpu: 1}}}",
	"database external":    "database: {mode: external, external: {existingSecret: pg, urlKey: dsn}}",
	"database storage":     "database: {bundled: {storage: 100Gi}}",
	"server image":         "images: {cubeServer: {tag: v9}}",
	"server replicas":      "controlPlane: {replicas: 5, pdb: {minAvailable: 3}}",
	"ingress":              "ingress: {enabled: true, domain: cube.example.com}",
	"update strategy":      "cubeNode: {updateStrategy: {type: OnDelete}}",
	"postgres image":       "images: {postgres: {tag: '17'}}",
	"control plane placem": "placement: {controlPlane: {nodeSelector: {pool: system}}}",
	"server metrics":       "metrics: {server: {enabled: false, port: 9100}}",
	"service monitors":     "metrics: {serviceMonitor: {enabled: true, interval: 15s, scrapeTimeout: 10s, labels: {release: kps}}}",
	"grafana dashboard":    "metrics: {grafanaDashboard: {enabled: true, namespace: monitoring, labels: {a: b}, annotations: {c: d}}}",
	"prometheus rule":      "metrics: {prometheusRule: {enabled: true, labels: {release: kps}}}",
}

func TestPolicyOnlyChangesKeepBigPodTemplate(t *testing.T) {
	base := nodeTemplate(t, render(t, ""))
	for name, vals := range policyOnly {
		t.Run(name, func(t *testing.T) {
			got := nodeTemplate(t, render(t, vals))
			if string(got) != string(base) {
				t.Fatalf("cube-node Pod template changed:\nbase %s\ngot  %s", base, got)
			}
		})
	}
}

// redLines are value changes that do change the Big Pod template (and so
// recreate it); listing them proves the guard can fail.
var redLines = map[string]string{
	"hostNetwork":   "cubeNode: {hostNetwork: false, hostNetworkChangeAck: true}",
	"cubelet image": "images: {cubelet: {tag: v9}}",
	"env":           "cubeNode: {env: [{name: FOO, value: bar}]}",
	"node cidr":     "cubeNode: {network: {cidr: 10.200.0.0/16}}",
	"compute pool":  "placement: {compute: {nodeSelector: {pool: gpu}}}",
	"metrics off":   "metrics: {enabled: false}",
	"node metrics":  "metrics: {node: {enabled: false}}",
	"metrics port":  "metrics: {node: {port: 9470}}",
}

func TestRedLineChangesChangeBigPodTemplate(t *testing.T) {
	base := nodeTemplate(t, render(t, ""))
	for name, vals := range redLines {
		t.Run(name, func(t *testing.T) {
			if got := nodeTemplate(t, render(t, vals)); string(got) == string(base) {
				t.Fatalf("%s did not change the cube-node Pod template", vals)
			}
		})
	}
}

func TestAckNeverInPodTemplate(t *testing.T) {
	for _, vals := range []string{"", "cubeNode: {hostNetworkChangeAck: true}"} {
		objs := render(t, vals)
		tmpl := strings.ToLower(string(nodeTemplate(t, objs)))
		// Not a bare "ack": FallbackToLogsOnError has one.
		if strings.Contains(tmpl, "changeack") || strings.Contains(tmpl, "--ack") {
			t.Fatalf("ack appears in the cube-node template: %s", tmpl)
		}
		job := get(t, objs, "Job", "cube-node-hostnet-preflight")
		want := "--ack=" + map[string]string{"": "false"}[vals]
		if vals != "" {
			want = "--ack=true"
		}
		if !strings.Contains(string(job.Raw), want) {
			t.Fatalf("hook Job lacks %s:\n%s", want, job.Raw)
		}
	}
}

func TestHostNetworkFalseDiffersOnlyInNetworkMode(t *testing.T) {
	on := dig(get(t, render(t, ""), "DaemonSet", "cube-node").Doc, "spec", "template", "spec").(map[string]any)
	off := dig(get(t, render(t, "cubeNode: {hostNetwork: false, hostNetworkChangeAck: true}"), "DaemonSet", "cube-node").Doc,
		"spec", "template", "spec").(map[string]any)
	if on["hostNetwork"] != true || on["dnsPolicy"] != "ClusterFirstWithHostNet" {
		t.Fatalf("default: hostNetwork=%v dnsPolicy=%v", on["hostNetwork"], on["dnsPolicy"])
	}
	if off["hostNetwork"] != false || off["dnsPolicy"] != "ClusterFirst" {
		t.Fatalf("pod network: hostNetwork=%v dnsPolicy=%v", off["hostNetwork"], off["dnsPolicy"])
	}
	args := func(spec map[string]any) []any {
		return spec["containers"].([]any)[0].(map[string]any)["args"].([]any)
	}
	if slices.Contains(args(on), any("--host-netns=auto")) || !slices.Contains(args(off), any("--host-netns=auto")) {
		t.Fatalf("--host-netns: on=%v off=%v", args(on), args(off))
	}
	// Remove the three differences: the rest is identical.
	for _, s := range []map[string]any{on, off} {
		delete(s, "hostNetwork")
		delete(s, "dnsPolicy")
		c := s["containers"].([]any)[0].(map[string]any)
		c["args"] = slices.DeleteFunc(args(s), func(a any) bool { return a == "--host-netns=auto" })
	}
	a, _ := json.Marshal(on)
	b, _ := json.Marshal(off)
	if string(a) != string(b) {
		t.Fatalf("specs differ beyond hostNetwork/dnsPolicy/--host-netns:\n%s\n%s", a, b)
	}
}

var standardLabels = []string{
	"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
	"app.kubernetes.io/part-of", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart",
}

func TestEveryObjectIsLabelledAndNamespaced(t *testing.T) {
	for _, vals := range []string{"", "ingress: {enabled: true, domain: cube.example.com}", computeOnly} {
		for _, o := range render(t, vals) {
			labels, _ := dig(o.Doc, "metadata", "labels").(map[string]any)
			for _, l := range standardLabels {
				if v, ok := labels[l].(string); !ok || v == "" {
					t.Errorf("%s %s (%s) lacks label %s", o.Kind(), o.Name(), o.Template, l)
				}
			}
			clusterScoped := o.Kind() == "ClusterRole" || o.Kind() == "ClusterRoleBinding"
			if !clusterScoped && dig(o.Doc, "metadata", "namespace") != "cube-system" {
				t.Errorf("%s %s is not in the release namespace", o.Kind(), o.Name())
			}
		}
	}
}

// Pod templates carry no version label, so a chart bump alone recreates nothing.
func TestPodTemplatesHaveStableLabels(t *testing.T) {
	for _, o := range render(t, "") {
		labels, ok := dig(o.Doc, "spec", "template", "metadata", "labels").(map[string]any)
		if !ok {
			continue
		}
		for _, l := range []string{"app.kubernetes.io/version", "helm.sh/chart"} {
			if _, bad := labels[l]; bad {
				t.Errorf("%s %s Pod template has label %s", o.Kind(), o.Name(), l)
			}
		}
	}
}

func TestControlPlaneProbesPDBAndRollout(t *testing.T) {
	objs := render(t, "")
	d := get(t, objs, "Deployment", "cube-server")
	if v := dig(d.Doc, "spec", "strategy", "rollingUpdate", "maxUnavailable"); v != float64(0) {
		t.Fatalf("maxUnavailable = %v", v)
	}
	c := dig(d.Doc, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	for _, p := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
		if dig(c, p, "httpGet", "path") != "/health" {
			t.Errorf("%s = %v", p, c[p])
		}
	}
	if args := fmt.Sprint(c["args"]); !strings.Contains(args, "--require-node-key") {
		t.Errorf("cube-server args %s: nodes may register without the API key", args)
	}
	pdb := get(t, objs, "PodDisruptionBudget", "cube-server")
	if dig(pdb.Doc, "spec", "minAvailable") != float64(1) {
		t.Fatalf("pdb = %v", pdb.Doc["spec"])
	}
	for _, n := range []string{"cube-postgres"} {
		get(t, objs, "StatefulSet", n)
		get(t, objs, "Service", n)
	}
	get(t, objs, "Service", "cube-server")
	if has(objs, "Ingress", "cube-server") {
		t.Fatal("ingress rendered while disabled")
	}
	ing := get(t, render(t, "ingress: {enabled: true, domain: cube.example.com, tlsSecretName: tls}"), "Ingress", "cube-server")
	if !strings.Contains(string(ing.Raw), `"*.cube.example.com"`) || !strings.Contains(string(ing.Raw), `"api.cube.example.com"`) {
		t.Fatalf("ingress hosts:\n%s", ing.Raw)
	}
	ext := render(t, "database: {mode: external, external: {existingSecret: pg}}")
	if has(ext, "StatefulSet", "cube-postgres") || !strings.Contains(string(get(t, ext, "Deployment", "cube-server").Raw), "name: pg") {
		t.Fatal("external database still renders the bundled one or misses the secret")
	}
}

func TestBigPodShape(t *testing.T) {
	ds := get(t, render(t, ""), "DaemonSet", "cube-node")
	spec := dig(ds.Doc, "spec", "template", "spec").(map[string]any)
	if spec["hostPID"] != true {
		t.Fatal("hostPID not set")
	}
	c := spec["containers"].([]any)[0].(map[string]any)
	if dig(c, "securityContext", "privileged") != true {
		t.Fatal("not privileged")
	}
	// Ready means registered with the server at the current address (the
	// cubelet's /readyz), not merely listening.
	if dig(c, "readinessProbe", "httpGet", "path") != "/readyz" || dig(c, "readinessProbe", "httpGet", "port") != "cubelet" {
		t.Errorf("cube-node readinessProbe = %v, want GET /readyz on port cubelet", c["readinessProbe"])
	}
	raw := string(ds.Raw)
	for _, want := range []string{
		"--node-id=$(NODE_NAME)", "--server=http://cube-server.cube-system.svc:3000", "--listen=0.0.0.0:7070",
		"--data-dir=/var/lib/cube", "--run-dir=/run/cube", "--node-cidr=172.16.0.0/18", "--cgroup-parent=cube",
		"--advertise-ip=$(POD_IP)", "--data-ip=$(HOST_IP)", "fieldPath: status.hostIP",
		"node.kubernetes.io/network-unavailable", "name: wait-node-prep", "cube.dev/compute",
		"terminationMessagePolicy: FallbackToLogsOnError",
	} {
		if !strings.Contains(raw, want) {
			t.Errorf("cube-node lacks %q", want)
		}
	}
	// No preStop hook: the runtime's SIGTERM to cubelet (the container's
	// main process) is the whole stop; a hook raced it and died with it.
	if lc, ok := c["lifecycle"]; ok {
		t.Errorf("cubelet has a lifecycle %v; the stop is the runtime's SIGTERM alone", lc)
	}
	// First init container: the host directories of the Bidirectional
	// mounts are made shared, before any container mounts them.
	inits := spec["initContainers"].([]any)
	first := inits[0].(map[string]any)
	if first["name"] != "share-mounts" || dig(first, "securityContext", "privileged") != true ||
		fmt.Sprint(first["args"]) != "[kube share-mounts --dir=/run/cube --dir=/var/lib/cube]" {
		t.Errorf("first init container %v, want the privileged share-mounts of /run/cube and /var/lib/cube", first)
	}
	mounts := map[string]any{}
	for _, m := range c["volumeMounts"].([]any) {
		mounts[m.(map[string]any)["mountPath"].(string)] = m.(map[string]any)["mountPropagation"]
	}
	if mounts["/run/cube"] != "Bidirectional" {
		t.Errorf("/run/cube propagation = %v", mounts["/run/cube"])
	}
	for _, p := range []string{"/var/lib/cube", "/sys/fs/cgroup"} {
		if _, ok := mounts[p]; !ok {
			t.Errorf("%s not mounted", p)
		}
	}
}

func TestHookRBACIsMinimal(t *testing.T) {
	objs := render(t, "")
	for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding", "Job"} {
		o := get(t, objs, kind, "cube-node-hostnet-preflight")
		if h := dig(o.Doc, "metadata", "annotations", "helm.sh/hook"); h != "pre-install,pre-upgrade,pre-rollback" {
			t.Errorf("%s hook = %v", kind, h)
		}
	}
	role := get(t, objs, "Role", "cube-node-hostnet-preflight")
	var rules []struct {
		APIGroups, Resources, ResourceNames, Verbs []string
	}
	b, _ := json.Marshal(role.Doc["rules"])
	json.Unmarshal(b, &rules)
	if len(rules) != 1 || !slices.Equal(rules[0].Verbs, []string{"get"}) || !slices.Equal(rules[0].Resources, []string{"daemonsets"}) ||
		!slices.Equal(rules[0].APIGroups, []string{"apps"}) {
		t.Fatalf("rules = %+v", rules)
	}
	job := get(t, objs, "Job", "cube-node-hostnet-preflight")
	if dig(job.Doc, "spec", "template", "spec", "serviceAccountName") != "cube-node-hostnet-preflight" {
		t.Fatal("job does not use its own ServiceAccount")
	}
}

const computeOnly = "controlPlane: {enabled: false}\nexternalControlPlane: {serverEndpoint: 'http://10.1.2.3:3000'}"

func TestComputeOnlyRelease(t *testing.T) {
	objs := render(t, computeOnly)
	for _, o := range objs {
		comp, _ := dig(o.Doc, "metadata", "labels", "app.kubernetes.io/component").(string)
		// The one Service: the nodes' metrics, for a Prometheus in this cluster.
		if comp == "server" || comp == "postgres" || o.Kind() == "Ingress" || (o.Kind() == "Service" && o.Name() != "cube-node-metrics") {
			t.Errorf("compute-only release renders %s %s", o.Kind(), o.Name())
		}
	}
	for _, n := range []string{"cube-node", "cube-node-bootstrap", "cube-node-installer"} {
		get(t, objs, "DaemonSet", n)
	}
	raw := string(get(t, objs, "DaemonSet", "cube-node").Raw)
	if !strings.Contains(raw, "--server=http://10.1.2.3:3000") || !strings.Contains(raw, "name: cube-api-key") {
		t.Fatalf("cube-node does not point at the external server:\n%s", raw)
	}
	if !strings.Contains(string(get(t, objs, "DaemonSet", "cube-node-bootstrap").Raw), "--server=http://10.1.2.3:3000") {
		t.Fatal("bootstrap does not probe the external server")
	}
}

func TestInvalidValuesFailRendering(t *testing.T) {
	cases := map[string]string{
		"compute-only without endpoint": "controlPlane: {enabled: false}",
		"compute-only on pod network":   computeOnly + "\ncubeNode: {hostNetwork: false}",
		"external db without secret":    "database: {mode: external}",
		"unknown db mode":               "database: {mode: sqlite}",
		"ingress without domain":        "ingress: {enabled: true}",
		"bad hostNetwork type":          "cubeNode: {hostNetwork: 'yes'}",
		"bad cidr":                      "cubeNode: {network: {cidr: 'not-a-cidr'}}",
		"generation zero":               "cubeNodeBootstrap: {prepGeneration: 0}",
		"ack not a bool":                "cubeNode: {hostNetworkChangeAck: 'true'}",
		"unknown runtime":               "cubeNodeBootstrap: {preflight: {runtime: gvisor}}",
		"bad service cidr":              "cubeNodeBootstrap: {preflight: {serviceCIDRs: [10.96.0.0]}}",
	}
	for name, vals := range cases {
		if _, err := Render(chartDir, vals); err == nil {
			t.Errorf("%s: rendered without error", name)
		}
	}
}

// TestRenderedObjectsDecodeStrictly is the lint-equivalent: every object
// decodes into its typed Kubernetes struct with unknown fields refused.
func TestRenderedObjectsDecodeStrictly(t *testing.T) {
	for _, vals := range []string{"", "ingress: {enabled: true, domain: d.example, tlsSecretName: t}", computeOnly,
		"cubeNode: {hostNetwork: false}", "database: {mode: external, external: {existingSecret: pg}}"} {
		for _, o := range render(t, vals) {
			typed, ok := typedObject(o.Kind())
			if !ok {
				t.Errorf("%s %s: kind not checked by this test", o.Kind(), o.Name())
				continue
			}
			if err := yaml.UnmarshalStrict(o.Raw, typed); err != nil {
				t.Errorf("%s %s (%s): %v", o.Kind(), o.Name(), o.Template, err)
			}
		}
	}
}

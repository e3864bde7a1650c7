package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestMetricsObjectsPassServerSideDryRun sends a release with every metrics
// feature on, ServiceMonitors included, to a real kube-apiserver with
// dryRun=All and fieldValidation=Strict, as a create and as a server-side
// apply. The API server has no Prometheus Operator: the test installs
// ServiceMonitor and PrometheusRule CRDs with the schema of the fields the
// chart uses (testdata/*-crd.yaml) and removes them afterwards.
func TestMetricsObjectsPassServerSideDryRun(t *testing.T) {
	cfg := realAPIServer(t)
	crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths:              []string{"testdata/servicemonitor-crd.yaml", "testdata/prometheusrule-crd.yaml"},
		ErrorIfPathMissing: true})
	if err != nil {
		t.Fatalf("install the ServiceMonitor and PrometheusRule CRDs: %v", err)
	}
	t.Cleanup(func() {
		if err := envtest.UninstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
			t.Errorf("uninstall the CRDs: %v", err)
		}
	})
	warn := &warnings{}
	cfg.WarningHandlerWithContext = warn
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	for _, ns := range []string{"cube-system", "monitoring"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	strict := []client.CreateOption{client.DryRunAll, client.FieldValidation("Strict")}

	all := "metrics: {serviceMonitor: {enabled: true, interval: 15s, scrapeTimeout: 10s, labels: {release: kps}}, prometheusRule: {enabled: true, labels: {release: kps}}, grafanaDashboard: {enabled: true, namespace: monitoring}}"
	sm := get(t, renderAPIs(t, all, monitoringAPI), "ServiceMonitor", "cube-node")
	// The check itself works: the CRD's schema refuses an unknown field
	// and a malformed interval.
	for what, mutate := range map[string]func(u *unstructured.Unstructured){
		"unknown field": func(u *unstructured.Unstructured) {
			eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
			eps[0].(map[string]any)["intervall"] = "15s"
			unstructured.SetNestedSlice(u.Object, eps, "spec", "endpoints")
		},
		"bad interval": func(u *unstructured.Unstructured) {
			eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
			eps[0].(map[string]any)["interval"] = "15 seconds"
			unstructured.SetNestedSlice(u.Object, eps, "spec", "endpoints")
		},
	} {
		u := (&unstructured.Unstructured{Object: sm.Doc}).DeepCopy()
		mutate(u)
		err := c.Create(ctx, u, strict...)
		if !apierrors.IsBadRequest(err) && !apierrors.IsInvalid(err) {
			t.Errorf("dry-run create of a ServiceMonitor with an %s = %v, want it refused", what, err)
		}
	}

	for _, p := range []struct{ name, values string }{
		{"all metrics", all},
		{"compute-only", computeOnly + "\n" + all},
		{"metrics off", "metrics: {enabled: false, serviceMonitor: {enabled: true}}"},
	} {
		t.Run(p.name, func(t *testing.T) {
			objs := renderAPIs(t, p.values, monitoringAPI)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.Kind()]++
				what := o.Kind() + " " + o.Name() + " (" + o.Template + ")"
				u := &unstructured.Unstructured{Object: o.Doc}
				if err := c.Create(ctx, u.DeepCopy(), strict...); err != nil {
					t.Errorf("dry-run create %s: %v", what, err)
				}
				if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), client.DryRunAll,
					client.FieldOwner("cube-chart-test"), client.ForceOwnership); err != nil {
					t.Errorf("dry-run apply %s: %v", what, err)
				}
				for _, w := range warn.take() {
					t.Errorf("%s: API server warning: %s", what, w)
				}
			}
			want := map[string]int{"all metrics": 2, "compute-only": 1, "metrics off": 0}[p.name]
			if kinds["ServiceMonitor"] != want {
				t.Errorf("%d ServiceMonitors, want %d", kinds["ServiceMonitor"], want)
			}
			if want := map[string]int{"all metrics": 1, "compute-only": 1, "metrics off": 0}[p.name]; kinds["PrometheusRule"] != want {
				t.Errorf("%d PrometheusRules, want %d", kinds["PrometheusRule"], want)
			}
			t.Logf("%d objects accepted: %v", len(objs), kinds)
		})
	}
}

package kube

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/hostnetgate"
)

// TestHostNetGateAgainstAPIServer runs the preflight hook's gate with a
// client-go client against a real kube-apiserver holding a live cube-node
// DaemonSet with hostNetwork: true.
func TestHostNetGateAgainstAPIServer(t *testing.T) {
	const ns = "cube-gate"
	cfg, kc := apiServerNamespace(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gate, err := hostnetgate.NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Fresh install: no DaemonSet yet, either mode is allowed without ack.
	for _, desired := range []bool{true, false} {
		if d, err := hostnetgate.Run(ctx, gate, ns, "cube-node", desired, false); err != nil || !d.Allow {
			t.Errorf("no DaemonSet, desired=%t: %+v, %v", desired, d, err)
		}
	}

	labels := map[string]string{"app.kubernetes.io/name": "cube", "app.kubernetes.io/component": "node"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "cube-node", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork: true,
					Containers:  []corev1.Container{{Name: "cubelet", Image: "cube/cubelet:test"}},
				},
			},
		},
	}
	if _, err := kc.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the API server is shared by the package run (and -count=N)
		kc.AppsV1().DaemonSets(ns).Delete(context.WithoutCancel(ctx), "cube-node", metav1.DeleteOptions{})
	})

	// Flip to the Pod network without ack: refused, naming both ways out.
	d, err := hostnetgate.Run(ctx, gate, ns, "cube-node", false, false)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || d.Allow {
		t.Fatalf("flip without ack = %+v, %v; want a FailedPrecondition refusal", d, err)
	}
	for _, want := range []string{
		"refusing to change hostNetwork of DaemonSet cube-node from true to false",
		"cubeNode.hostNetworkChangeAck=true", // way out 1: confirm
		"cubeNode.hostNetwork=true",          // way out 2: keep the live value
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not mention %q", err, want)
		}
	}

	// With ack: allowed. Unchanged: allowed.
	if d, err := hostnetgate.Run(ctx, gate, ns, "cube-node", false, true); err != nil || !d.Allow || !strings.Contains(d.Message, "acknowledged") {
		t.Errorf("flip with ack = %+v, %v", d, err)
	}
	if d, err := hostnetgate.Run(ctx, gate, ns, "cube-node", true, false); err != nil || !d.Allow {
		t.Errorf("unchanged hostNetwork = %+v, %v", d, err)
	}
}

// apiServerNamespace returns the real kube-apiserver's config, a client for
// it and namespace ns created there (kept if it exists).
func apiServerNamespace(t *testing.T, ns string) (*rest.Config, kubernetes.Interface) {
	t.Helper()
	cfg := realAPIServer(t)
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return cfg, kc
}

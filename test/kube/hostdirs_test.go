package kube

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// fromDoc converts a rendered document into a typed object.
func fromDoc(t *testing.T, doc map[string]any, into any) {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
}

// podSpec returns the Pod template spec of a workload document.
func podSpec(t *testing.T, o Object) (corev1.PodSpec, bool) {
	t.Helper()
	if dig(o.Doc, "spec", "template", "spec") == nil {
		return corev1.PodSpec{}, false
	}
	var tmpl corev1.PodTemplateSpec
	fromDoc(t, dig(o.Doc, "spec", "template").(map[string]any), &tmpl)
	return tmpl.Spec, true
}

// TestBidirectionalHostPathsAreMadeShared: every Pod that mounts a host
// path with mountPropagation: Bidirectional first runs `cube kube
// share-mounts` for that path (privileged, hostPID, as an init container
// that itself mounts nothing Bidirectional), in every profile: the kubelet
// refuses such a mount on a host whose / is private, and the chart must not
// leave that to the operator.
func TestBidirectionalHostPathsAreMadeShared(t *testing.T) {
	for _, p := range dryRunProfiles {
		t.Run(p.name, func(t *testing.T) {
			checked := 0
			for _, o := range render(t, p.values) {
				spec, ok := podSpec(t, o)
				if !ok {
					continue
				}
				hostPaths := map[string]string{}
				for _, v := range spec.Volumes {
					if v.HostPath != nil {
						hostPaths[v.Name] = v.HostPath.Path
					}
				}
				var need []string
				for _, c := range spec.Containers {
					for _, m := range c.VolumeMounts {
						if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
							hp, ok := hostPaths[m.Name]
							if !ok {
								t.Errorf("%s %s: Bidirectional mount of %s, which is not a hostPath", o.Kind(), o.Name(), m.Name)
							}
							need = append(need, hp)
						}
					}
				}
				if len(need) == 0 {
					continue
				}
				checked++
				what := o.Kind() + " " + o.Name()
				if !spec.HostPID {
					t.Errorf("%s: share-mounts finds the host's mount namespace through hostPID, which is off", what)
				}
				if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != "share-mounts" {
					t.Errorf("%s: Bidirectional host paths %v, but the first init container is not share-mounts", what, need)
					continue
				}
				ic := spec.InitContainers[0]
				if ic.SecurityContext == nil || ic.SecurityContext.Privileged == nil || !*ic.SecurityContext.Privileged {
					t.Errorf("%s: share-mounts is not privileged", what)
				}
				if !slices.Equal(ic.Command, []string{"/usr/local/bin/cube"}) || !slices.Equal(ic.Args[:2], []string{"kube", "share-mounts"}) {
					t.Errorf("%s: share-mounts runs %v %v", what, ic.Command, ic.Args)
				}
				for _, hp := range need {
					if !slices.Contains(ic.Args, "--dir="+hp) {
						t.Errorf("%s: %s is mounted Bidirectional but share-mounts has %v", what, hp, ic.Args)
					}
				}
				for _, m := range ic.VolumeMounts {
					if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
						t.Errorf("%s: share-mounts itself mounts %s Bidirectional (it would fail the same way)", what, m.Name)
					}
				}
				if strings.Contains(ic.Image, ":") == false {
					t.Errorf("%s: share-mounts image %q has no tag", what, ic.Image)
				}
			}
			if checked < 2 {
				t.Errorf("%d Pods with Bidirectional host paths checked, want cube-node and cube-node-bootstrap", checked)
			}
		})
	}
}

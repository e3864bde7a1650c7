package nodecontroller

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cube-dev/cube/internal/cluster"
)

func TestWantOf(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name        string
		ann         map[string]string
		deleting    bool
		wantDrain   *drainSpec
		wantProblem bool
		wantForce   bool
		grace       time.Duration // 0: not checked
	}{
		{name: "nothing"},
		{name: "kill default grace", ann: map[string]string{AnnotationDrain: "kill"}, wantDrain: &drainSpec{cluster.DrainKill, cluster.DefaultDrainGrace}},
		{name: "wait with grace", ann: map[string]string{AnnotationDrain: "wait", AnnotationDrainGrace: "90s"}, wantDrain: &drainSpec{cluster.DrainWait, 90 * time.Second}},
		{name: "zero grace", ann: map[string]string{AnnotationDrain: " kill ", AnnotationDrainGrace: "0s"}, wantDrain: &drainSpec{cluster.DrainKill, 0}},
		{name: "bad policy", ann: map[string]string{AnnotationDrain: "true"}, wantProblem: true},
		{name: "bad grace", ann: map[string]string{AnnotationDrain: "kill", AnnotationDrainGrace: "soon"}, wantProblem: true},
		{name: "negative grace", ann: map[string]string{AnnotationDrain: "kill", AnnotationDrainGrace: "-1s"}, wantProblem: true},
		{name: "huge grace", ann: map[string]string{AnnotationDrain: "kill", AnnotationDrainGrace: "48h"}, wantProblem: true},
		{name: "force", ann: map[string]string{AnnotationForceDelete: "true"}, deleting: true, wantForce: true},
		{name: "force needs true", ann: map[string]string{AnnotationForceDelete: "yes"}, deleting: true},
		{name: "grace alone is read", ann: map[string]string{AnnotationDrainGrace: "5s"}, deleting: true, grace: 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: tc.ann}}
			if tc.deleting {
				n.DeletionTimestamp = &now
			}
			w := wantOf(n)
			if (w.Problem != "") != tc.wantProblem {
				t.Fatalf("problem %q, want problem %v", w.Problem, tc.wantProblem)
			}
			if (w.Drain == nil) != (tc.wantDrain == nil) || (w.Drain != nil && *w.Drain != *tc.wantDrain) {
				t.Fatalf("drain %+v, want %+v", w.Drain, tc.wantDrain)
			}
			if tc.grace != 0 && w.Grace != tc.grace {
				t.Fatalf("grace %v, want %v", w.Grace, tc.grace)
			}
			if w.Force != tc.wantForce || w.Deleting != tc.deleting {
				t.Fatalf("force %v deleting %v", w.Force, w.Deleting)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	kill := &drainSpec{cluster.DrainKill, time.Second}
	wait := &drainSpec{cluster.DrainWait, time.Second}
	draining := func(p cluster.DrainPolicy, n int) Status {
		return Status{State: cluster.StateDraining, Sandboxes: n, Drain: &cluster.DrainState{Policy: p, Phase: "grace", Remaining: n}}
	}
	ready := Status{State: cluster.StateReady}
	isolated := Status{State: cluster.StateIsolated}
	for _, tc := range []struct {
		name    string
		w       want
		found   bool
		st      Status
		actions []action
		release bool
	}{
		{name: "unregistered does nothing", w: want{Unschedulable: true}},
		{name: "cordon isolates", w: want{Unschedulable: true}, found: true, st: ready, actions: []action{actIsolate}},
		{name: "cordon on isolated is a no-op", w: want{Unschedulable: true}, found: true, st: isolated},
		{name: "cordon keeps a drain", w: want{Unschedulable: true}, found: true, st: draining(cluster.DrainKill, 1)},
		{name: "cordon on a Down node isolates again", w: want{Unschedulable: true}, found: true, st: Status{State: cluster.StateDown}, actions: []action{actIsolate}},
		{name: "uncordon", found: true, st: isolated, actions: []action{actUncordon}},
		{name: "uncordon cancels a drain", found: true, st: draining(cluster.DrainWait, 2), actions: []action{actUncordon}},
		{name: "schedulable and ready", found: true, st: ready},
		{name: "schedulable and Down left alone", found: true, st: Status{State: cluster.StateDown}},
		{name: "drain annotation drains", w: want{Drain: kill}, found: true, st: ready, actions: []action{actDrain}},
		{name: "drain already running", w: want{Drain: kill}, found: true, st: draining(cluster.DrainKill, 3)},
		{name: "drain policy change", w: want{Drain: wait}, found: true, st: draining(cluster.DrainKill, 3), actions: []action{actDrain}},
		{name: "bad annotation never cancels a drain", w: want{Problem: "x"}, found: true, st: draining(cluster.DrainKill, 3)},
		{name: "delete unregistered releases", w: want{Deleting: true}, release: true},
		{name: "delete empty ready node", w: want{Deleting: true}, found: true, st: ready, actions: []action{actIsolate, actDelete}, release: true},
		{name: "delete empty isolated node", w: want{Deleting: true}, found: true, st: isolated, actions: []action{actDelete}, release: true},
		{name: "delete empty Down node", w: want{Deleting: true}, found: true, st: Status{State: cluster.StateDown}, actions: []action{actDelete}, release: true},
		{name: "delete busy node drains first", w: want{Deleting: true}, found: true, st: Status{State: cluster.StateReady, Sandboxes: 2}, actions: []action{actDrain}},
		{name: "delete waits for the drain", w: want{Deleting: true}, found: true, st: draining(cluster.DrainKill, 2)},
		{name: "delete waits for in-flight creates", w: want{Deleting: true}, found: true, st: Status{State: cluster.StateDraining, Inflight: 1, Drain: &cluster.DrainState{Policy: cluster.DrainKill, Phase: "grace"}}},
		{name: "delete uses the grace annotation", w: want{Deleting: true, Grace: 5 * time.Second}, found: true, st: Status{State: cluster.StateIsolated, Sandboxes: 1}, actions: []action{actDrain}},
		{name: "delete with annotation policy", w: want{Deleting: true, Drain: wait}, found: true, st: draining(cluster.DrainKill, 2), actions: []action{actDrain}},
		{name: "force delete", w: want{Deleting: true, Force: true}, found: true, st: draining(cluster.DrainKill, 2), actions: []action{actForceDelete}, release: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(tc.w, tc.found, tc.st)
			if !slices.Equal(p.Actions, tc.actions) || p.RemoveFinalizer != tc.release {
				t.Fatalf("plan %+v, want actions %v release %v", p, tc.actions, tc.release)
			}
			if slices.Contains(p.Actions, actDrain) && p.Drain.Policy == "" {
				t.Fatalf("drain without a policy: %+v", p)
			}
			if tc.w.Deleting && tc.w.Drain == nil && slices.Contains(p.Actions, actDrain) && p.Drain.Grace != tc.w.Grace {
				t.Fatalf("deletion drain grace %v, want the annotation's %v", p.Drain.Grace, tc.w.Grace)
			}
		})
	}
}

func TestStatusOf(t *testing.T) {
	down := Status{State: cluster.StateDown, Sandboxes: 2, Drain: &cluster.DrainState{Policy: cluster.DrainKill, Phase: "killing", Remaining: 2}}
	for _, tc := range []struct {
		name  string
		w     want
		found bool
		st    Status
		phase string // "" = no annotation
	}{
		{name: "no drain asked", found: true, st: Status{State: cluster.StateReady}},
		{name: "unregistered", w: want{Drain: &drainSpec{cluster.DrainKill, time.Minute}}, phase: phaseUnregistered},
		{name: "pending", w: want{Drain: &drainSpec{cluster.DrainKill, time.Minute}}, found: true, st: Status{State: cluster.StateReady}, phase: phasePending},
		{name: "progress", w: want{Drain: &drainSpec{cluster.DrainKill, time.Minute}}, found: true, st: down, phase: "killing"},
		{name: "bad annotation", w: want{Problem: "bad"}, found: true, phase: phaseError},
		{name: "deleting a Down node is blocked", w: want{Deleting: true}, found: true, st: down, phase: phaseBlocked},
		{name: "forced is not blocked", w: want{Deleting: true, Force: true}, found: true, st: down, phase: "killing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := statusOf(tc.w, tc.found, tc.st)
			if tc.phase == "" {
				if s != "" {
					t.Fatalf("status %q, want none", s)
				}
				return
			}
			var ds drainStatus
			if err := json.Unmarshal([]byte(s), &ds); err != nil {
				t.Fatalf("status %q: %v", s, err)
			}
			if ds.Phase != tc.phase {
				t.Fatalf("phase %q, want %q (%s)", ds.Phase, tc.phase, s)
			}
		})
	}
}

func TestRequeueAfter(t *testing.T) {
	busy := Status{State: cluster.StateDraining, Drain: &cluster.DrainState{Phase: "waiting"}}
	done := Status{State: cluster.StateDraining, Drain: &cluster.DrainState{Phase: "done"}}
	if d := requeueAfter(want{}, true, busy, time.Minute); d != 2*time.Second {
		t.Fatalf("draining: %v", d)
	}
	if d := requeueAfter(want{}, true, done, time.Minute); d != time.Minute {
		t.Fatalf("drain done: %v", d)
	}
	if d := requeueAfter(want{Deleting: true}, true, Status{State: cluster.StateDown}, time.Minute); d != 10*time.Second {
		t.Fatalf("deleting a Down node: %v", d)
	}
	if d := requeueAfter(want{}, false, Status{}, time.Minute); d != time.Minute {
		t.Fatalf("unregistered: %v", d)
	}
}

// FuzzWantOf: annotations are user input; whatever they hold, a drain is
// either well-formed or reported as a problem, never both.
func FuzzWantOf(f *testing.F) {
	for _, s := range [][2]string{{"kill", "60s"}, {"wait", "0s"}, {"true", ""}, {"kill", "-1s"}, {" wait ", "1h30m"}, {"", "9999999h"}} {
		f.Add(s[0], s[1], true)
	}
	f.Fuzz(func(t *testing.T, policy, grace string, withGrace bool) {
		ann := map[string]string{AnnotationDrain: policy}
		if withGrace {
			ann[AnnotationDrainGrace] = grace
		}
		w := wantOf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: ann}})
		if (w.Drain == nil) == (w.Problem == "") {
			t.Fatalf("drain %+v and problem %q", w.Drain, w.Problem)
		}
		if d := w.Drain; d != nil {
			if d.Policy != cluster.DrainKill && d.Policy != cluster.DrainWait || d.Grace < 0 || d.Grace > maxGrace {
				t.Fatalf("accepted %+v", d)
			}
		}
		p := decide(w, true, Status{State: cluster.StateReady})
		if w.Problem != "" && len(p.Actions) != 0 {
			t.Fatalf("bad annotation acted: %+v", p)
		}
		if s := statusOf(w, true, Status{}); s == "" {
			t.Fatal("no status for a drain annotation")
		}
	})
}

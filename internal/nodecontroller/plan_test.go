package nodecontroller

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

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
		if c := drainConditionOf(w, true, Status{State: cluster.StateReady}); (w.Problem != "") != (c.Reason == ReasonInvalidAnnotation) || c.Reason == "" || c.Message == "" {
			t.Fatalf("problem %q, condition %+v", w.Problem, c)
		}
	})
}

func TestConditionsOf(t *testing.T) {
	kill := &drainSpec{cluster.DrainKill, time.Minute}
	drainSt := func(phase string, n int) Status {
		return Status{State: cluster.StateDraining, Sandboxes: n, Drain: &cluster.DrainState{Policy: cluster.DrainWait, Phase: phase, Remaining: n}}
	}
	down := Status{State: cluster.StateDown, Sandboxes: 2, Drain: &cluster.DrainState{Policy: cluster.DrainKill, Phase: "killing", Remaining: 2}}
	T, F := corev1.ConditionTrue, corev1.ConditionFalse
	for _, tc := range []struct {
		name        string
		w           want
		found       bool
		st          Status
		status      corev1.ConditionStatus
		reason      string
		msg         []string // substrings of the drain condition's message
		sched       corev1.ConditionStatus
		schedReason string
	}{
		{name: "nothing asked", found: true, st: Status{State: cluster.StateReady}, status: F, reason: ReasonNotDraining, sched: T, schedReason: "Ready"},
		{name: "cordoned", w: want{Unschedulable: true}, found: true, st: Status{State: cluster.StateIsolated}, status: F, reason: ReasonNotDraining, sched: F, schedReason: "Isolated"},
		{name: "unregistered, nothing asked", status: F, reason: ReasonNotDraining, sched: F, schedReason: ReasonUnregistered},
		{name: "unregistered, drain asked", w: want{Drain: kill}, status: F, reason: ReasonUnregistered, sched: F, schedReason: ReasonUnregistered},
		{name: "pending", w: want{Drain: kill}, found: true, st: Status{State: cluster.StateReady, Sandboxes: 3}, status: T, reason: ReasonPending, msg: []string{"3 sandboxes", "policy kill"}, sched: T, schedReason: "Ready"},
		{name: "grace", w: want{Drain: kill}, found: true, st: drainSt("grace", 1), status: T, reason: "Grace", msg: []string{"1 sandbox remaining", "policy wait"}, sched: F, schedReason: "Draining"},
		{name: "waiting", w: want{Drain: kill}, found: true, st: drainSt("waiting", 4), status: T, reason: "Waiting", msg: []string{"4 sandboxes remaining"}, sched: F, schedReason: "Draining"},
		{name: "killing", w: want{Drain: kill}, found: true, st: drainSt("killing", 2), status: T, reason: "Killing", msg: []string{"2 sandboxes remaining"}, sched: F, schedReason: "Draining"},
		{name: "unknown phase", w: want{Drain: kill}, found: true, st: drainSt("re-checking", 2), status: T, reason: "ReChecking", sched: F, schedReason: "Draining"},
		{name: "done", w: want{Drain: kill}, found: true, st: drainSt("done", 0), status: F, reason: ReasonDone, msg: []string{"0 sandboxes remaining", "policy wait", AnnotationDrain}, sched: F, schedReason: "Draining"},
		{name: "bad annotation on a ready node", w: want{Problem: "cube.dev/drain=\"true\": want kill or wait"}, found: true, st: Status{State: cluster.StateReady}, status: F, reason: ReasonInvalidAnnotation, msg: []string{"want kill or wait", "left as it is"}, sched: T, schedReason: "Ready"},
		{name: "bad annotation during a drain", w: want{Problem: "bad"}, found: true, st: drainSt("grace", 2), status: T, reason: ReasonInvalidAnnotation, msg: []string{"bad", "2 sandboxes remaining"}, sched: F, schedReason: "Draining"},
		{name: "deletion pending", w: want{Deleting: true}, found: true, st: Status{State: cluster.StateReady, Sandboxes: 1}, status: T, reason: ReasonPending, msg: []string{"deleted", "policy kill"}, sched: T, schedReason: "Ready"},
		{name: "deletion drains despite a bad annotation", w: want{Deleting: true, Problem: "bad"}, found: true, st: drainSt("killing", 1), status: T, reason: "Killing", msg: []string{"deleted", "ignored: bad"}, sched: F, schedReason: "Draining"},
		{name: "deletion blocked on a Down node", w: want{Deleting: true}, found: true, st: down, status: T, reason: ReasonBlocked, msg: []string{"2 sandboxes", AnnotationForceDelete}, sched: F, schedReason: "Down"},
		{name: "forced deletion is not blocked", w: want{Deleting: true, Force: true}, found: true, st: down, status: T, reason: "Killing", sched: F, schedReason: "Down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := conditionsOf(tc.w, tc.found, tc.st)
			if len(cs) != 2 || cs[0].Type != ConditionDrain || cs[1].Type != ConditionSchedulable {
				t.Fatalf("conditions %+v", cs)
			}
			d, s := cs[0], cs[1]
			if d.Status != tc.status || d.Reason != tc.reason {
				t.Errorf("%s = %s/%s (%s), want %s/%s", d.Type, d.Status, d.Reason, d.Message, tc.status, tc.reason)
			}
			for _, m := range tc.msg {
				if !strings.Contains(d.Message, m) {
					t.Errorf("%s message %q lacks %q", d.Type, d.Message, m)
				}
			}
			if s.Status != tc.sched || s.Reason != tc.schedReason {
				t.Errorf("%s = %s/%s, want %s/%s", s.Type, s.Status, s.Reason, tc.sched, tc.schedReason)
			}
			for _, c := range cs {
				if c.Message == "" || !c.LastTransitionTime.IsZero() || !c.LastHeartbeatTime.IsZero() {
					t.Errorf("condition %+v: want a message and no times", c)
				}
			}
		})
	}
}

func TestMergeConditions(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0.Add(time.Hour + 500*time.Millisecond)
	old := metav1.NewTime(t0)
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: old}
	grace := corev1.NodeCondition{Type: ConditionDrain, Status: corev1.ConditionTrue, Reason: "Grace", Message: "2 left", LastTransitionTime: old, LastHeartbeatTime: old}
	cond := func(s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: ConditionDrain, Status: s, Reason: reason, Message: msg}
	}
	for _, tc := range []struct {
		name       string
		existing   []corev1.NodeCondition
		desired    corev1.NodeCondition
		write      bool
		transition time.Time
	}{
		{name: "new", existing: []corev1.NodeCondition{ready}, desired: cond(corev1.ConditionFalse, ReasonNotDraining, "x"), write: true, transition: now},
		{name: "unchanged", existing: []corev1.NodeCondition{ready, grace}, desired: cond(corev1.ConditionTrue, "Grace", "2 left")},
		{name: "progress keeps the transition", existing: []corev1.NodeCondition{grace}, desired: cond(corev1.ConditionTrue, "Killing", "1 left"), write: true, transition: t0},
		{name: "status change is a transition", existing: []corev1.NodeCondition{grace, ready}, desired: cond(corev1.ConditionFalse, ReasonDone, "0 left"), write: true, transition: now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := mergeConditions(tc.existing, []corev1.NodeCondition{tc.desired}, now)
			if !tc.write {
				if out != nil {
					t.Fatalf("writes %+v, want nothing", out)
				}
				return
			}
			if len(out) != 1 {
				t.Fatalf("writes %+v, want one condition", out)
			}
			c := out[0]
			if c.Type != tc.desired.Type || c.Status != tc.desired.Status || c.Reason != tc.desired.Reason || c.Message != tc.desired.Message {
				t.Fatalf("writes %+v, want %+v", c, tc.desired)
			}
			if !c.LastTransitionTime.Time.Equal(tc.transition.Truncate(time.Second)) || !c.LastHeartbeatTime.Time.Equal(now.Truncate(time.Second)) {
				t.Fatalf("times: transition %v heartbeat %v, want %v and %v", c.LastTransitionTime, c.LastHeartbeatTime, tc.transition, now)
			}
		})
	}
}

// The patch sent to nodes/status, applied as the API server applies a
// strategic merge patch, sets and removes only the controller's conditions.
func TestConditionsPatch(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}
	pressure := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory"}
	sched := corev1.NodeCondition{Type: ConditionSchedulable, Status: corev1.ConditionTrue, Reason: "Ready"}
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready, sched, pressure}}}
	apply := func(n corev1.Node, set []corev1.NodeCondition, remove []corev1.NodeConditionType) corev1.Node {
		t.Helper()
		p, err := conditionsPatch(set, remove)
		if err != nil {
			t.Fatal(err)
		}
		orig, _ := json.Marshal(n)
		b, err := strategicpatch.StrategicMergePatch(orig, p, corev1.Node{})
		if err != nil {
			t.Fatalf("apply %s: %v", p, err)
		}
		var out corev1.Node
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	types := func(n corev1.Node) map[corev1.NodeConditionType]string {
		m := map[corev1.NodeConditionType]string{}
		for _, c := range n.Status.Conditions {
			m[c.Type] = string(c.Status) + "/" + c.Reason
		}
		return m
	}
	set := mergeConditions(node.Status.Conditions, conditionsOf(want{}, true, Status{State: cluster.StateIsolated}), time.Now())
	got := types(apply(node, set, nil))
	wantSet := map[corev1.NodeConditionType]string{corev1.NodeReady: "True/KubeletReady", corev1.NodeMemoryPressure: "False/KubeletHasSufficientMemory",
		ConditionSchedulable: "False/Isolated", ConditionDrain: "False/NotDraining"}
	if !maps.Equal(got, wantSet) {
		t.Fatalf("after set: %v, want %v", got, wantSet)
	}
	removed := apply(node, nil, staleConditions(node.Status.Conditions))
	if got, want := types(removed), map[corev1.NodeConditionType]string{corev1.NodeReady: "True/KubeletReady", corev1.NodeMemoryPressure: "False/KubeletHasSufficientMemory"}; !maps.Equal(got, want) {
		t.Fatalf("after remove: %v, want %v", got, want)
	}
	if s := staleConditions(removed.Status.Conditions); s != nil {
		t.Fatalf("stale conditions after removal: %v", s)
	}
}

func TestCamel(t *testing.T) {
	for in, want := range map[string]string{"grace": "Grace", "done": "Done", "re-checking": "ReChecking", "": "Unknown", "9x": "Unknown9x", "Down": "Down"} {
		if got := camel(in); got != want {
			t.Errorf("camel(%q) = %q, want %q", in, got, want)
		}
	}
}

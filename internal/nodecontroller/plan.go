package nodecontroller

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cube-dev/cube/internal/cluster"
)

// Annotations and the finalizer the controller reads and writes on Nodes.
const (
	// AnnotationDrain asks for a Cube drain: "kill" or "wait".
	AnnotationDrain = "cube.dev/drain"
	// AnnotationDrainGrace is the drain's grace period, a Go duration ("60s").
	AnnotationDrainGrace = "cube.dev/drain-grace"
	// AnnotationDrainStatus is written by the controller: drain progress as JSON.
	AnnotationDrainStatus = "cube.dev/drain-status"
	// AnnotationForceDelete "true" makes a Node deletion forget the Cube
	// node's sandboxes instead of draining them first.
	AnnotationForceDelete = "cube.dev/force-delete"
	// Finalizer holds a managed Node until its Cube node is deregistered.
	Finalizer = "cube.dev/node-controller"
)

// maxGrace bounds the drain-grace annotation.
const maxGrace = 24 * time.Hour

// action is one call to Cube.
type action string

const (
	actIsolate     action = "isolate"
	actUncordon    action = "uncordon"
	actDrain       action = "drain"
	actDelete      action = "delete"
	actForceDelete action = "force-delete"
)

// reason is the Event reason recorded when the action succeeded.
func (a action) reason() string {
	switch a {
	case actIsolate:
		return "CubeIsolated"
	case actUncordon:
		return "CubeUncordoned"
	case actDrain:
		return "CubeDrainStarted"
	case actDelete:
		return "CubeNodeDeleted"
	case actForceDelete:
		return "CubeNodeForceDeleted"
	}
	return "CubeUpdated"
}

// want is what a Node asks of its Cube node.
type want struct {
	Deleting      bool
	Unschedulable bool
	Force         bool
	Drain         *drainSpec    // nil: no drain annotation
	Grace         time.Duration // drain-grace annotation, else the default
	Problem       string        // an annotation that could not be parsed
}

type drainSpec struct {
	Policy cluster.DrainPolicy
	Grace  time.Duration
}

// wantOf reads a Node's spec, deletion and annotations.
func wantOf(n *corev1.Node) want {
	w := want{
		Deleting:      n.DeletionTimestamp != nil,
		Unschedulable: n.Spec.Unschedulable,
		Force:         n.Annotations[AnnotationForceDelete] == "true",
		Grace:         cluster.DefaultDrainGrace,
	}
	if g, ok := n.Annotations[AnnotationDrainGrace]; ok {
		dur, err := time.ParseDuration(strings.TrimSpace(g))
		if err != nil || dur < 0 || dur > maxGrace {
			w.Problem = fmt.Sprintf("%s=%q: want a duration between 0s and %s", AnnotationDrainGrace, g, maxGrace)
			return w
		}
		w.Grace = dur
	}
	p, ok := n.Annotations[AnnotationDrain]
	if !ok {
		return w
	}
	d := drainSpec{Policy: cluster.DrainPolicy(strings.TrimSpace(p)), Grace: w.Grace}
	if d.Policy != cluster.DrainKill && d.Policy != cluster.DrainWait {
		w.Problem = fmt.Sprintf("%s=%q: want kill or wait", AnnotationDrain, p)
		return w
	}
	w.Drain = &d
	return w
}

// plan is what one reconcile does.
type plan struct {
	Actions         []action
	Drain           drainSpec // for actDrain
	RemoveFinalizer bool      // after every action succeeded
}

// decide turns a Node's wishes and its Cube node's status (found false:
// not registered) into Cube calls. It is level-based: for managed Nodes
// Kubernetes is the source of truth, so repeating it is harmless.
//
//   - drain annotation: drain with that policy (a drain isolates too);
//   - spec.unschedulable: isolate;
//   - neither: uncordon (which also cancels a drain);
//   - deletion with cube.dev/force-delete=true: force delete;
//   - deletion otherwise: drain (annotation policy, else kill; grace from
//     cube.dev/drain-grace, else Cube's default), delete once the node
//     holds no sandboxes.
func decide(w want, found bool, st Status) plan {
	if w.Deleting {
		return decideDelete(w, found, st)
	}
	if !found || w.Problem != "" {
		return plan{} // a bad annotation holds the node as it is, never cancels a drain
	}
	draining := st.Drain != nil
	switch {
	case w.Drain != nil:
		if !draining || st.Drain.Policy != w.Drain.Policy {
			return plan{Actions: []action{actDrain}, Drain: *w.Drain}
		}
	case w.Unschedulable:
		// Down hides whether the node is isolated; isolating again is idempotent.
		if !draining && st.State != cluster.StateIsolated {
			return plan{Actions: []action{actIsolate}}
		}
	default:
		if draining || st.State == cluster.StateIsolated {
			return plan{Actions: []action{actUncordon}}
		}
	}
	return plan{}
}

func decideDelete(w want, found bool, st Status) plan {
	switch {
	case !found:
		return plan{RemoveFinalizer: true}
	case w.Force:
		return plan{Actions: []action{actForceDelete}, RemoveFinalizer: true}
	case st.Sandboxes == 0 && st.Inflight == 0:
		if st.State == cluster.StateReady || st.State == cluster.StatePending {
			return plan{Actions: []action{actIsolate, actDelete}, RemoveFinalizer: true}
		}
		return plan{Actions: []action{actDelete}, RemoveFinalizer: true}
	}
	// Without a drain annotation: kill after the grace period (drain-grace
	// annotation, else Cube's default).
	d := drainSpec{Policy: cluster.DrainKill, Grace: w.Grace}
	if w.Drain != nil {
		d = *w.Drain
	}
	if st.Drain == nil || st.Drain.Policy != d.Policy {
		return plan{Actions: []action{actDrain}, Drain: d}
	}
	return plan{}
}

// drainStatus is the value of the cube.dev/drain-status annotation.
type drainStatus struct {
	Policy    cluster.DrainPolicy `json:"policy,omitempty"`
	Phase     string              `json:"phase"`
	Remaining int                 `json:"remaining"`
	Message   string              `json:"message,omitempty"`
}

// Phases the controller adds to Cube's (grace, waiting, killing, done).
const (
	phaseError        = "error"
	phaseUnregistered = "unregistered"
	phaseBlocked      = "blocked"
	phasePending      = "pending"
)

// statusOf is the drain-status annotation to show, "" for none. It is
// shown while a drain is asked for, and while a deletion waits.
func statusOf(w want, found bool, st Status) string {
	if w.Drain == nil && w.Problem == "" && !w.Deleting {
		return ""
	}
	var s drainStatus
	switch {
	case w.Problem != "":
		s = drainStatus{Phase: phaseError, Message: w.Problem}
	case !found:
		s = drainStatus{Phase: phaseUnregistered, Message: "no Cube node with this name is registered"}
	case st.Drain == nil:
		s = drainStatus{Phase: phasePending, Remaining: st.Sandboxes}
	default:
		s = drainStatus{Policy: st.Drain.Policy, Phase: st.Drain.Phase, Remaining: st.Drain.Remaining}
	}
	if w.Deleting && found && st.State == cluster.StateDown && st.Sandboxes > 0 && !w.Force {
		s.Phase, s.Remaining = phaseBlocked, st.Sandboxes
		s.Message = fmt.Sprintf("the Cube node is Down with %d sandboxes: bring its cubelet back, or set %s=true to forget them",
			st.Sandboxes, AnnotationForceDelete)
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// requeueAfter is when to look at the Cube node again without a Node
// event: soon while a drain or deletion is in progress, slowly otherwise
// (to pick up a late registration or undo drift).
func requeueAfter(w want, found bool, st Status, resync time.Duration) time.Duration {
	const busy = 2 * time.Second
	switch {
	case w.Deleting && found:
		if st.State == cluster.StateDown {
			return 10 * time.Second
		}
		return busy
	case found && st.Drain != nil && st.Drain.Phase != "done":
		return busy
	}
	return resync
}

package nodecontroller

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cube-dev/cube/internal/cluster"
)

// Node condition types the controller maintains on every managed Node (and
// removes when the Node stops being managed). Both are owned by the
// controller alone; the kubelet's conditions (Ready, MemoryPressure, ...)
// are never written.
const (
	// ConditionDrain is True while a Cube drain of the node is in progress
	// or blocked, False otherwise (polarity like MemoryPressure: True is the
	// state that needs attention). Its reason is the drain's phase.
	ConditionDrain corev1.NodeConditionType = "CubeDrain"
	// ConditionSchedulable is True when the Cube node takes new sandboxes
	// (Cube state Ready); its reason is the Cube state otherwise.
	ConditionSchedulable corev1.NodeConditionType = "CubeSchedulable"
)

// ownConditions are the condition types the controller writes.
var ownConditions = []corev1.NodeConditionType{ConditionDrain, ConditionSchedulable}

// Reasons of ConditionDrain. Cube's own phases map to Grace, Waiting,
// Killing and Done (an unknown future phase to its CamelCase form).
const (
	ReasonNotDraining       = "NotDraining"
	ReasonPending           = "Pending"
	ReasonDone              = "Done"
	ReasonBlocked           = "Blocked"
	ReasonUnregistered      = "Unregistered"
	ReasonInvalidAnnotation = "InvalidAnnotation"
)

// conditionsOf is the desired state of the controller's Node conditions
// for a Node's wishes and its Cube node's status (found false: not
// registered). Times are left zero: mergeConditions sets them.
func conditionsOf(w want, found bool, st Status) []corev1.NodeCondition {
	return []corev1.NodeCondition{drainConditionOf(w, found, st), schedulableConditionOf(found, st)}
}

func drainConditionOf(w want, found bool, st Status) corev1.NodeCondition {
	c := func(s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: ConditionDrain, Status: s, Reason: reason, Message: msg}
	}
	if w.Problem != "" && !w.Deleting { // a deletion drains anyway (decideDelete)
		s, now := corev1.ConditionFalse, "no drain in progress"
		if found && st.Drain != nil && st.Drain.Phase != "done" {
			s, now = corev1.ConditionTrue, drainProgress(st.Drain)
		}
		return c(s, ReasonInvalidAnnotation, fmt.Sprintf("%s; the Cube node is left as it is (%s)", w.Problem, now))
	}
	cond := drainProgressOf(w, found, st)
	if w.Problem != "" {
		cond.Message += " (ignored: " + w.Problem + ")"
	}
	return cond
}

func drainProgressOf(w want, found bool, st Status) corev1.NodeCondition {
	c := func(s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: ConditionDrain, Status: s, Reason: reason, Message: msg}
	}
	asked := w.Drain != nil || w.Deleting
	policy := cluster.DrainKill // what a deletion without a drain annotation uses
	if w.Drain != nil {
		policy = w.Drain.Policy
	}
	prefix := ""
	if w.Deleting {
		prefix = "Node is being deleted: "
	}
	switch {
	case !found && asked:
		return c(corev1.ConditionFalse, ReasonUnregistered, "no Cube node with this name is registered: nothing to drain")
	case !found:
		return c(corev1.ConditionFalse, ReasonNotDraining, "no drain requested (no Cube node with this name is registered)")
	case w.Deleting && !w.Force && st.State == cluster.StateDown && st.Sandboxes > 0:
		return c(corev1.ConditionTrue, ReasonBlocked, fmt.Sprintf(
			"%sthe Cube node is Down with %s (policy %s): bring its cubelet back, or set %s=true to forget them",
			prefix, sandboxes(st.Sandboxes), policy, AnnotationForceDelete))
	case st.Drain != nil && st.Drain.Phase == "done":
		msg := fmt.Sprintf("%sdrain finished (policy %s): 0 sandboxes remaining", prefix, st.Drain.Policy)
		if !w.Deleting {
			msg += fmt.Sprintf("; the Cube node stays isolated until %s is removed", AnnotationDrain)
		}
		return c(corev1.ConditionFalse, ReasonDone, msg)
	case st.Drain != nil:
		return c(corev1.ConditionTrue, camel(st.Drain.Phase), prefix+drainProgress(st.Drain))
	case asked:
		return c(corev1.ConditionTrue, ReasonPending, fmt.Sprintf("%sdrain (policy %s) requested, not started yet: %s on the node",
			prefix, policy, sandboxes(st.Sandboxes)))
	}
	return c(corev1.ConditionFalse, ReasonNotDraining, fmt.Sprintf("no drain requested (annotate %s=kill or =wait to drain)", AnnotationDrain))
}

// drainProgress describes a drain Cube reports.
func drainProgress(d *cluster.DrainState) string {
	what := map[string]string{
		"grace":   "grace period, new sandboxes refused",
		"waiting": "waiting for sandboxes to end",
		"killing": "killing sandboxes",
	}[d.Phase]
	if what == "" {
		what = "phase " + d.Phase
	}
	return fmt.Sprintf("draining (policy %s, %s): %s remaining", d.Policy, what, sandboxes(d.Remaining))
}

func schedulableConditionOf(found bool, st Status) corev1.NodeCondition {
	c := func(s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: ConditionSchedulable, Status: s, Reason: reason, Message: msg}
	}
	if !found {
		return c(corev1.ConditionFalse, ReasonUnregistered, "no Cube node with this name is registered")
	}
	switch st.State {
	case cluster.StateReady:
		return c(corev1.ConditionTrue, "Ready", "the Cube node takes new sandboxes")
	case cluster.StateIsolated:
		return c(corev1.ConditionFalse, "Isolated", "the Cube node is isolated (cordoned): no new sandboxes, running ones stay")
	case cluster.StateDraining:
		return c(corev1.ConditionFalse, "Draining", "the Cube node is draining: no new sandboxes")
	case cluster.StateDown:
		return c(corev1.ConditionFalse, "Down", "the Cube node is Down (missed heartbeats and probes): no new sandboxes")
	case cluster.StatePending:
		return c(corev1.ConditionFalse, "Pending", "the Cube node has not answered since the server started (waiting for it to register or heartbeat): no new sandboxes yet")
	}
	return c(corev1.ConditionFalse, camel(string(st.State)), fmt.Sprintf("the Cube node is %s", st.State))
}

func sandboxes(n int) string {
	if n == 1 {
		return "1 sandbox"
	}
	return fmt.Sprintf("%d sandboxes", n)
}

// camel turns a Cube phase or state ("grace") into a condition reason
// ("Grace"): letters and digits only, each word capitalised.
func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.FieldsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	if b.Len() == 0 || b.String()[0] >= '0' && b.String()[0] <= '9' {
		return "Unknown" + b.String()
	}
	return b.String()
}

// mergeConditions returns the conditions among desired that differ from
// existing (in status, reason or message), stamped for writing:
// lastHeartbeatTime is now, lastTransitionTime is now only when the status
// changed (else the existing one). Nothing to write: nil.
func mergeConditions(existing, desired []corev1.NodeCondition, now time.Time) []corev1.NodeCondition {
	t := metav1.NewTime(now.Truncate(time.Second)) // the wire format has seconds
	var out []corev1.NodeCondition
	for _, d := range desired {
		i := slices.IndexFunc(existing, func(c corev1.NodeCondition) bool { return c.Type == d.Type })
		if i >= 0 {
			e := existing[i]
			if e.Status == d.Status && e.Reason == d.Reason && e.Message == d.Message {
				continue
			}
			if e.Status == d.Status && !e.LastTransitionTime.IsZero() {
				d.LastTransitionTime = e.LastTransitionTime
			}
		}
		if d.LastTransitionTime.IsZero() {
			d.LastTransitionTime = t
		}
		d.LastHeartbeatTime = t
		out = append(out, d)
	}
	return out
}

// staleConditions are the controller's condition types present on a Node
// that is no longer managed.
func staleConditions(existing []corev1.NodeCondition) []corev1.NodeConditionType {
	var out []corev1.NodeConditionType
	for _, c := range existing {
		if slices.Contains(ownConditions, c.Type) && !slices.Contains(out, c.Type) {
			out = append(out, c.Type)
		}
	}
	return out
}

// conditionsPatch is a strategic merge patch of nodes/status that sets the
// given conditions and deletes the given types. Node conditions merge by
// type, so every other condition (the kubelet's) is left untouched.
func conditionsPatch(set []corev1.NodeCondition, remove []corev1.NodeConditionType) ([]byte, error) {
	items := make([]any, 0, len(set)+len(remove))
	for _, c := range set {
		items = append(items, c)
	}
	for _, t := range remove {
		items = append(items, map[string]string{"$patch": "delete", "type": string(t)})
	}
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": items}})
	if err != nil {
		return nil, fmt.Errorf("encode node conditions patch: %w", err)
	}
	return b, nil
}

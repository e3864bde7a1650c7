// Package hostnetgate decides whether a Helm release may change the
// hostNetwork mode of the cube-node DaemonSet. Flipping it recreates every
// Big Pod; Cube's sandboxes survive that (they live in host cgroups and the
// pinned cube-dp netns), but cubelet's address changes, so the change must be
// deliberate: it is refused unless acknowledged.
package hostnetgate

import (
	"context"
	"fmt"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Live is what the cluster has now.
type Live struct {
	// Exists is false when the DaemonSet is absent (first install).
	Exists      bool
	HostNetwork bool
}

// Decision is the gate's verdict.
type Decision struct {
	Allow   bool
	Message string
}

// Decide compares the live DaemonSet with the desired hostNetwork value.
// A change is allowed only with ack; the refusal names both ways out.
func Decide(name string, live Live, desired, ack bool) Decision {
	switch {
	case !live.Exists:
		return Decision{true, fmt.Sprintf("DaemonSet %s does not exist yet: installing with hostNetwork=%t", name, desired)}
	case live.HostNetwork == desired:
		return Decision{true, fmt.Sprintf("DaemonSet %s keeps hostNetwork=%t", name, desired)}
	case ack:
		return Decision{true, fmt.Sprintf("DaemonSet %s changes hostNetwork %t -> %t, acknowledged by cubeNode.hostNetworkChangeAck=true: every cube-node Pod will be recreated (sandboxes keep running)",
			name, live.HostNetwork, desired)}
	default:
		return Decision{false, fmt.Sprintf("refusing to change hostNetwork of DaemonSet %s from %t to %t: this recreates every cube-node Pod and moves cubelet's address. "+
			"Either set cubeNode.hostNetworkChangeAck=true to confirm the change (then set it back to false), "+
			"or keep the live value with cubeNode.hostNetwork=%t",
			name, live.HostNetwork, desired, live.HostNetwork)}
	}
}

// DaemonSets reads the live hostNetwork of a DaemonSet.
type DaemonSets interface {
	// HostNetwork returns the live state; an absent DaemonSet is
	// Live{Exists: false} with a nil error.
	HostNetwork(ctx context.Context, namespace, name string) (Live, error)
}

// Run reads the live DaemonSet and decides. A refusal is an error of kind
// ErrFailedPrecondition carrying the decision's message.
func Run(ctx context.Context, ds DaemonSets, namespace, name string, desired, ack bool) (Decision, error) {
	live, err := ds.HostNetwork(ctx, namespace, name)
	if err != nil {
		return Decision{}, fmt.Errorf("hostnet preflight: read DaemonSet %s/%s: %w", namespace, name, err)
	}
	d := Decide(name, live, desired, ack)
	if !d.Allow {
		return d, fmt.Errorf("%s: %w", d.Message, errdefs.ErrFailedPrecondition)
	}
	return d, nil
}

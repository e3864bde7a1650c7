package kubereal

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// drainStatus is the node controller's cube.dev/drain-status annotation.
type drainStatus struct {
	Policy    string `json:"policy"`
	Phase     string `json:"phase"`
	Remaining int    `json:"remaining"`
	Message   string `json:"message"`
}

func kubeNode(ctx context.Context) (corev1.Node, error) {
	var n corev1.Node
	return n, kubeJSON(ctx, &n, "get", "node", env.Node)
}

func nodeCondition(n corev1.Node, typ string) (corev1.NodeCondition, bool) {
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ {
			return c, true
		}
	}
	return corev1.NodeCondition{}, false
}

// testNodeController: kubectl cordon isolates the Cube node (creates are
// refused on this one-node cluster), uncordon makes it Ready; the drain
// annotation drains it with progress in the annotation, the Node's
// conditions and `cube node ls`, and kills every sandbox.
func testNodeController(t *testing.T) {
	mustKubectl(t, "rollout", "status", "deployment/cube-node-controller", "--timeout=3m")
	waitCubeNodeState(t, "Ready", 2*time.Minute)
	t.Cleanup(func() {
		if _, err := kubectl(testCtx(t), "annotate", "node", env.Node, "cube.dev/drain-", "cube.dev/drain-grace-"); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if _, err := kubectl(testCtx(t), "uncordon", env.Node); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		waitCubeNodeState(t, "Ready", 2*time.Minute)
	})

	mustKubectl(t, "cordon", env.Node)
	waitCubeNodeState(t, "Isolated", 90*time.Second)
	waitFor(t, "Node condition CubeSchedulable False/Isolated", time.Minute, time.Second, func(ctx context.Context) (bool, string) {
		n, err := kubeNode(ctx)
		if err != nil {
			return false, err.Error()
		}
		c, _ := nodeCondition(n, "CubeSchedulable")
		return c.Status == corev1.ConditionFalse && c.Reason == "Isolated", fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	var r struct {
		OK    bool   `json:"ok"`
		ID    string `json:"id"`
		Error string `json:"error"`
	}
	if err := sdk(testCtx(t), 2*time.Minute, &r, "try-create"); err != nil {
		t.Fatal(err)
	}
	if r.OK {
		t.Errorf("a create on the cordoned (isolated) only node succeeded: sandbox %s", r.ID)
	} else {
		t.Logf("create while cordoned refused as it should be: %s", r.Error)
	}
	if sharedFleet != nil {
		sharedFleet.verify(t, "cordon (isolated nodes keep their sandboxes)")
	}
	mustKubectl(t, "uncordon", env.Node)
	waitCubeNodeState(t, "Ready", 90*time.Second)
	mustCreateOne(t, "after uncordon")

	testDrain(t)
}

// testDrain drains through the annotation with policy kill and follows the
// progress until phase done.
func testDrain(t *testing.T) {
	var own []string
	if err := sdk(testCtx(t), 5*time.Minute, &own, "create-counters", "3"); err != nil {
		t.Fatalf("create sandboxes to drain: %v", err)
	}
	total := len(own)
	if sharedFleet != nil {
		total += len(sharedFleet.ids)
	}
	// The drain kills every sandbox of the node: the fleet too.
	sharedFleet = nil
	start := time.Now()
	mustKubectl(t, "annotate", "node", env.Node, "cube.dev/drain=kill", "cube.dev/drain-grace=10s", "--overwrite")
	var seen []string
	var last, lastCond string
	maxRemaining := 0
	// Logged also when the wait fails: the progress is what shows why.
	defer func() {
		t.Logf("drain progress (annotation cube.dev/drain-status | condition CubeDrain):\n  %s", strings.Join(seen, "\n  "))
	}()
	waitFor(t, "the drain to reach phase done", 4*time.Minute, 500*time.Millisecond, func(ctx context.Context) (bool, string) {
		n, err := kubeNode(ctx)
		if err != nil {
			return false, err.Error()
		}
		raw := n.Annotations["cube.dev/drain-status"]
		var st drainStatus
		if raw != "" {
			if err := json.Unmarshal([]byte(raw), &st); err != nil {
				return false, fmt.Sprintf("cube.dev/drain-status %q: %v", raw, err)
			}
		}
		c, _ := nodeCondition(n, "CubeDrain")
		cur := fmt.Sprintf("phase %s remaining %d | CubeDrain %s %s: %s", st.Phase, st.Remaining, c.Status, c.Reason, c.Message)
		if cur != last {
			seen = append(seen, fmt.Sprintf("+%v %s", time.Since(start).Round(100*time.Millisecond), cur))
			last = cur
		}
		maxRemaining = max(maxRemaining, st.Remaining)
		lastCond = c.Reason
		return st.Phase == "done" && st.Remaining == 0, cur
	})
	if maxRemaining < total {
		t.Errorf("the drain's progress never showed the %d sandboxes on the node (most remaining seen: %d)", total, maxRemaining)
	}
	if lastCond != "Done" {
		waitFor(t, "condition CubeDrain reason Done", time.Minute, time.Second, func(ctx context.Context) (bool, string) {
			n, err := kubeNode(ctx)
			if err != nil {
				return false, err.Error()
			}
			c, _ := nodeCondition(n, "CubeDrain")
			return c.Reason == "Done" && c.Status == corev1.ConditionFalse, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
		})
	}
	cn, err := cubeNode(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if cn.Drain == nil || cn.Drain.Phase != "done" || cn.Sandboxes != 0 {
		t.Errorf("cube node ls after the drain: state %s, %d sandboxes, drain %+v", cn.State, cn.Sandboxes, cn.Drain)
	}
	states, err := sandboxStates(testCtx(t), own)
	if err != nil {
		t.Fatal(err)
	}
	for id, s := range states {
		if s != "gone" {
			t.Errorf("sandbox %s is %s after the drain (policy kill)", id, s)
		}
	}
	mustKubectl(t, "annotate", "node", env.Node, "cube.dev/drain-", "cube.dev/drain-grace-")
	mustKubectl(t, "uncordon", env.Node)
	waitCubeNodeState(t, "Ready", 90*time.Second)
	mustCreateOne(t, "after the drain was cancelled")
}

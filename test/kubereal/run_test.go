package kubereal

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cube-dev/cube/internal/cluster"
)

// cmdTimeout bounds every single kubectl/helm/cube call; helm calls that
// wait for rollouts pass their own.
const cmdTimeout = 2 * time.Minute

// run executes name with args and returns its combined output. The error
// names the command and carries the output's tail.
func run(ctx context.Context, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(string(out), 40))
	}
	return string(out), nil
}

// must runs a command, logs it and fails the test when it fails.
func must(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	t.Logf("$ %s %s", name, strings.Join(args, " "))
	out, err := run(testCtx(t), timeout, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func kubectl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, cmdTimeout, "kubectl", append([]string{"-n", env.Namespace}, args...)...)
}

func mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	return must(t, cmdTimeout, "kubectl", append([]string{"-n", env.Namespace}, args...)...)
}

// kubeJSON decodes `kubectl get ... -o json` into out.
func kubeJSON(ctx context.Context, out any, args ...string) error {
	s, err := kubectl(ctx, append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(s), out); err != nil {
		return fmt.Errorf("decode kubectl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// cubeNode is the Cube node of the cluster's Node as the server reports it
// (`cube node ls --json`, as an operator reads it).
func cubeNode(ctx context.Context) (cluster.NodeStatus, error) {
	out, err := run(ctx, 30*time.Second, env.CubeBin, "node", "ls", "--json", "--server", env.APIURL, "--api-key", env.APIKey)
	if err != nil {
		return cluster.NodeStatus{}, err
	}
	var nodes []cluster.NodeStatus
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		return cluster.NodeStatus{}, fmt.Errorf("decode cube node ls --json: %w: %s", err, tail(out, 5))
	}
	for _, n := range nodes {
		if n.ID == env.Node {
			return n, nil
		}
	}
	return cluster.NodeStatus{}, fmt.Errorf("cube node ls has no node %q (%d nodes)", env.Node, len(nodes))
}

// waitFor polls cond every interval until it reports done, failing the
// test after timeout with what it waited for and the last detail cond gave.
func waitFor(t *testing.T, what string, timeout, interval time.Duration, cond func(ctx context.Context) (bool, string)) string {
	t.Helper()
	ctx := testCtx(t)
	deadline := time.Now().Add(timeout)
	var detail string
	for {
		var done bool
		done, detail = cond(ctx)
		if done {
			return detail
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, detail)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("test ended while waiting for %s", what)
		case <-time.After(interval):
		}
	}
}

// waitCubeNodeState waits until the server reports the node in state.
func waitCubeNodeState(t *testing.T, state cluster.State, timeout time.Duration) cluster.NodeStatus {
	t.Helper()
	var last cluster.NodeStatus
	waitFor(t, fmt.Sprintf("cube node %s to be %s", env.Node, state), timeout, time.Second, func(ctx context.Context) (bool, string) {
		n, err := cubeNode(ctx)
		if err != nil {
			return false, err.Error()
		}
		last = n
		return n.State == state, fmt.Sprintf("state %s, reason %q, version %s", n.State, n.Reason, n.Version)
	})
	return last
}

// nodePods lists the cube-node Pods (terminating ones included).
func nodePods(ctx context.Context) ([]corev1.Pod, error) {
	var l corev1.PodList
	if err := kubeJSON(ctx, &l, "get", "pods", "-l", "app.kubernetes.io/component=node"); err != nil {
		return nil, err
	}
	return l.Items, nil
}

func podReady(p corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// readyNodePod waits until exactly one cube-node Pod exists and is Ready.
func readyNodePod(t *testing.T, timeout time.Duration) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	waitFor(t, "one Ready cube-node Pod", timeout, time.Second, func(ctx context.Context) (bool, string) {
		pods, err := nodePods(ctx)
		if err != nil {
			return false, err.Error()
		}
		if len(pods) != 1 || !podReady(pods[0]) {
			return false, describePods(pods)
		}
		pod = pods[0]
		return true, ""
	})
	return pod
}

func describePods(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return "no cube-node Pod"
	}
	var b []string
	for _, p := range pods {
		s := fmt.Sprintf("%s uid=%s phase=%s ready=%v", p.Name, p.UID, p.Status.Phase, podReady(p))
		if p.DeletionTimestamp != nil {
			s += " terminating"
		}
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			s += fmt.Sprintf(" %s(restarts=%d", c.Name, c.RestartCount)
			if w := c.State.Waiting; w != nil {
				s += " waiting " + w.Reason + ": " + w.Message
			}
			if x := c.State.Terminated; x != nil {
				s += fmt.Sprintf(" terminated %s exit %d", x.Reason, x.ExitCode)
			}
			s += ")"
		}
		b = append(b, s)
	}
	return strings.Join(b, "; ")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// cubeletContainer is the cubelet container of a cube-node Pod.
func cubeletContainer(t *testing.T, p corev1.Pod) corev1.Container {
	t.Helper()
	for _, c := range p.Spec.Containers {
		if c.Name == "cubelet" {
			return c
		}
	}
	t.Fatalf("Pod %s has no container cubelet", p.Name)
	return corev1.Container{}
}

// dsGeneration is metadata.generation of the cube-node DaemonSet: it moves
// with every change of its spec, the Pod template included.
func dsGeneration(t *testing.T) string {
	t.Helper()
	out, err := kubectl(testCtx(t), "get", "daemonset", "cube-node", "-o", "jsonpath={.metadata.generation}")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// assertPodKept fails when what changed the cube-node DaemonSet's spec or
// replaced its Pod (checked again after a few seconds: a rollout is not
// instant).
func assertPodKept(t *testing.T, pod corev1.Pod, gen, what string) {
	t.Helper()
	if now := dsGeneration(t); now != gen {
		t.Errorf("%s changed the cube-node DaemonSet's spec (generation %s -> %s)", what, gen, now)
	}
	time.Sleep(5 * time.Second)
	now := readyNodePod(t, 2*time.Minute)
	if now.UID != pod.UID {
		t.Errorf("%s replaced the cube-node Pod (%s %s -> %s %s)", what, pod.Name, pod.UID, now.Name, now.UID)
	}
}

package cluster

import (
	"fmt"
	"strings"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
)

// NodeHealth is what a cubelet checks about itself and reports with its
// registration and heartbeats (nodev1.NodeHealth): checks that need the
// node's host, readable from the server by `cube node ls` and helm test.
type NodeHealth struct {
	Socket    SocketHealth    `json:"socket"`
	Preflight PreflightHealth `json:"preflight"`
}

// SocketHealth says whether the cubelet's own CubeletService listener
// answered the cubelet's call.
type SocketHealth struct {
	Serving   bool      `json:"serving"`
	Address   string    `json:"address,omitempty"`
	Error     string    `json:"error,omitempty"`
	CheckedAt time.Time `json:"checkedAt"`
}

// Preflight states a node reports (preflight.PrepState).
const (
	PrepPassed  = "passed"
	PrepFailed  = "failed"
	PrepNone    = "none"
	PrepInvalid = "invalid"
)

// PreflightHealth is the newest record of the node's prep directory.
type PreflightHealth struct {
	State        string    `json:"state"` // passed, failed, none, invalid
	Generation   int       `json:"generation,omitempty"`
	At           time.Time `json:"at,omitzero"`
	FailedChecks []string  `json:"failedChecks,omitempty"`
	Warnings     int       `json:"warnings,omitempty"`
	Detail       string    `json:"detail,omitempty"`
}

// healthFromProto converts a reported health; nil when none was reported.
func healthFromProto(h *nodev1.NodeHealth) *NodeHealth {
	if h == nil {
		return nil
	}
	s, p := h.GetSocket(), h.GetPreflight()
	out := &NodeHealth{
		Socket: SocketHealth{Serving: s.GetServing(), Address: s.GetAddress(), Error: s.GetError(),
			CheckedAt: unixMs(s.GetCheckedAtUnixMs())},
		Preflight: PreflightHealth{State: p.GetState(), Generation: int(p.GetGeneration()), At: unixMs(p.GetAtUnixMs()),
			FailedChecks: p.GetFailedChecks(), Warnings: int(p.GetWarnings()), Detail: p.GetDetail()},
	}
	if out.Preflight.State == "" {
		out.Preflight.State = PrepNone
	}
	return out
}

func unixMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// Summary is the short form `cube node ls` prints: socket, then prep,
// e.g. "ok gen 3", "FAIL gen 3 failed", "ok none", or "-" when the node
// reported nothing.
func (h *NodeHealth) Summary() string {
	if h == nil {
		return "-"
	}
	sock := "ok"
	if !h.Socket.Serving {
		sock = "FAIL"
	}
	p := h.Preflight
	switch p.State {
	case PrepPassed:
		return fmt.Sprintf("%s gen %d", sock, p.Generation)
	case PrepNone:
		return sock + " none"
	default:
		return fmt.Sprintf("%s gen %d %s", sock, p.Generation, p.State)
	}
}

// HealthProblems says what is wrong with a node's reported health, one
// sentence each naming what to check; none when healthy. wantGen > 0 also
// requires a passed preflight fingerprint of that prep generation
// (cubeNodeBootstrap.prepGeneration); 0 checks the socket only.
func (s NodeStatus) HealthProblems(wantGen int) []string {
	h := s.Health
	if h == nil {
		return []string{fmt.Sprintf("node %s (cubelet %s) reports no health: upgrade its cube-node Pod to a cubelet that reports it", s.ID, s.Version)}
	}
	var out []string
	if !h.Socket.Serving {
		out = append(out, fmt.Sprintf("node %s: cubelet's own API at %s does not answer (%s): check the cube-node Pod on that node (kubectl logs, readiness) and the cubelet's --listen address",
			s.ID, orUnknown(h.Socket.Address), orUnknown(h.Socket.Error)))
	}
	if wantGen > 0 {
		if p := prepProblem(s.ID, h.Preflight, wantGen); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func prepProblem(id string, p PreflightHealth, want int) string {
	const pod = "the cube-node-bootstrap Pod on that node"
	switch {
	case p.State == PrepPassed && p.Generation == want:
		return ""
	case p.State == PrepPassed:
		return fmt.Sprintf("node %s: preflight passed for prep generation %d, want %d: check that %s runs with --generation=%d (kubectl rollout status daemonset/cube-node-bootstrap)",
			id, p.Generation, want, pod, want)
	case p.State == PrepFailed:
		return fmt.Sprintf("node %s: preflight of prep generation %d failed at %s: %s; fix the node, then read the report in the logs of %s",
			id, p.Generation, p.At.Format(time.RFC3339), strings.Join(p.FailedChecks, "; "), pod)
	case p.State == PrepInvalid:
		return fmt.Sprintf("node %s: prep record unreadable (%s): delete it and restart %s", id, p.Detail, pod)
	default:
		return fmt.Sprintf("node %s: no preflight fingerprint (%s): check that %s ran and that cubelet's --prep-dir is /var/lib/cube/prep",
			id, orUnknown(p.Detail), pod)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// HealthCheck is the verdict over every node of `cube node check-health`
// (the helm test cube-test-node-health).
type HealthCheck struct {
	Ready    int      // nodes in state Ready: the ones checked
	Healthy  []string // one line per healthy Ready node
	Problems []string // one sentence per problem, naming what to check
	Skipped  []string // nodes not Ready, not checked
}

// OK is true when at least one node is Ready and every Ready node is healthy.
func (c HealthCheck) OK() bool { return c.Ready > 0 && len(c.Problems) == 0 }

// CheckNodes checks the reported health of every Ready node (see
// NodeStatus.HealthProblems for wantGen).
func CheckNodes(nodes []NodeStatus, wantGen int) HealthCheck {
	var c HealthCheck
	for _, n := range nodes {
		if n.State != StateReady {
			c.Skipped = append(c.Skipped, fmt.Sprintf("node %s: %s, not checked", n.ID, n.State))
			continue
		}
		c.Ready++
		if p := n.HealthProblems(wantGen); len(p) > 0 {
			c.Problems = append(c.Problems, p...)
			continue
		}
		c.Healthy = append(c.Healthy, healthyLine(n, wantGen))
	}
	return c
}

func healthyLine(n NodeStatus, wantGen int) string {
	h := n.Health
	line := fmt.Sprintf("node %s: cubelet API answers at %s", n.ID, h.Socket.Address)
	p := h.Preflight
	switch {
	case wantGen == 0:
		return line + fmt.Sprintf("; preflight not checked (node reports %s)", strings.TrimSpace(p.State+" "+genText(p.Generation)))
	default:
		return line + fmt.Sprintf("; preflight generation %d passed at %s (%d warnings)", p.Generation, p.At.Format(time.RFC3339), p.Warnings)
	}
}

func genText(gen int) string {
	if gen == 0 {
		return ""
	}
	return fmt.Sprintf("for generation %d", gen)
}

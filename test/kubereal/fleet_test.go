package kubereal

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cubelet"
)

// fleetSize sandboxes run a counter through every Big Pod event.
const fleetSize = 10

// fleet is the set of counter sandboxes shared by the tests that recreate
// the Big Pod; a test that loses or kills them drops it and the next test
// makes a new one.
type fleet struct {
	ids  []string
	last map[string]int // counter value at the last check
}

var sharedFleet *fleet

// checkResult is one sandbox of `sdk.mjs check`.
type checkResult struct {
	ID     string `json:"id"`
	OK     bool   `json:"ok"`
	Before int    `json:"before"`
	After  int    `json:"after"`
	Error  string `json:"error"`
}

// counterFleet returns the shared fleet, creating it when needed.
func counterFleet(t *testing.T) *fleet {
	t.Helper()
	if sharedFleet != nil {
		return sharedFleet
	}
	start := time.Now()
	var ids []string
	if err := sdk(testCtx(t), 10*time.Minute, &ids, "create-counters", fmt.Sprint(fleetSize)); err != nil {
		t.Fatalf("create %d counter sandboxes: %v", fleetSize, err)
	}
	f := &fleet{ids: ids, last: map[string]int{}}
	sharedFleet = f
	t.Logf("created %d counter sandboxes in %v: %s", len(ids), time.Since(start).Round(time.Millisecond), strings.Join(ids, " "))
	f.verify(t, "creation")
	return f
}

// dropFleet forgets the shared fleet (after sandboxes were lost or a drain
// killed them) and kills whatever is left of it.
func dropFleet(t *testing.T) {
	if sharedFleet == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var killed map[string]bool
	if err := sdk(ctx, 2*time.Minute, &killed, "kill", sharedFleet.ids...); err != nil {
		t.Logf("kill the old fleet: %v", err)
	}
	sharedFleet = nil
}

// verify checks every sandbox of the fleet after event: the same id
// answers a command and the files API, its marker is its own id, and its
// counter is above the value of the previous check and still advancing.
// A fleet that lost sandboxes is dropped.
func (f *fleet) verify(t *testing.T, event string) {
	t.Helper()
	var res []checkResult
	if err := sdk(testCtx(t), 5*time.Minute, &res, "check", f.ids...); err != nil {
		dropFleet(t)
		t.Fatalf("check the %d sandboxes after %s: %v", len(f.ids), event, err)
	}
	var bad []string
	var advanced []string
	for _, r := range res {
		prev := f.last[r.ID]
		switch {
		case !r.OK:
			bad = append(bad, fmt.Sprintf("%s: %s", r.ID, r.Error))
		case r.Before <= prev:
			bad = append(bad, fmt.Sprintf("%s: counter %d not above %d before %s", r.ID, r.Before, prev, event))
		default:
			advanced = append(advanced, fmt.Sprintf("%d->%d", prev, r.After))
		}
		if r.OK {
			f.last[r.ID] = r.After
		}
	}
	if len(bad) > 0 {
		dropFleet(t)
		t.Fatalf("after %s, %d of %d sandboxes are lost or stopped counting:\n  %s", event, len(bad), len(f.ids), strings.Join(bad, "\n  "))
	}
	t.Logf("after %s: all %d sandboxes answer commands and files with their own id; counters advanced %s", event, len(res), strings.Join(advanced, " "))
}

// mapdump is `cube node mapdump --json` of the node (run on the host: the
// node is this machine), with the node's settings from the release.
type mapdumpDoc struct {
	Source    string                  `json:"source"`
	Note      string                  `json:"note"`
	Dataplane bool                    `json:"dataplane"`
	Mappings  []cubelet.MappingStatus `json:"mappings"`
}

// assertNoOrphans fails the test when mapdump shows a mapping without a
// live owner or with a disagreeing one, and when a sandbox of the fleet
// owns no mapping.
func assertNoOrphans(t *testing.T, f *fleet) {
	t.Helper()
	args := append([]string{"node", "mapdump", "--json"}, nodeFlags(t)...)
	out := must(t, cmdTimeout, env.CubeBin, args...)
	var doc mapdumpDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("decode mapdump: %v\n%s", err, tail(out, 20))
	}
	count := map[string]int{}
	owners := map[string]bool{}
	var bad []string
	for _, m := range doc.Mappings {
		count[m.Status]++
		if m.Status == cubelet.StatusOwned {
			// A sandbox made from a warm-pool slot: the slot owns the
			// mapping and the detail names the sandbox.
			owners[m.Owner] = true
			owners[strings.TrimPrefix(m.Detail, "sandbox ")] = true
		} else {
			bad = append(bad, fmt.Sprintf("%d -> %s:%d owner %q %s %s", m.HostPort, m.SandboxIP, m.GuestPort, m.Owner, m.Status, m.Detail))
		}
	}
	if !doc.Dataplane {
		t.Errorf("mapdump: no dataplane pinned (source %s, %s)", doc.Source, doc.Note)
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Errorf("mapdump: %d orphan and %d conflicting mappings:\n  %s", count[cubelet.StatusOrphan], count[cubelet.StatusConflict], strings.Join(bad, "\n  "))
	}
	if f != nil {
		var unowned []string
		for _, id := range f.ids {
			if !owners[id] {
				unowned = append(unowned, id)
			}
		}
		if len(unowned) > 0 {
			t.Errorf("mapdump: sandboxes of the fleet own no mapping: %s", strings.Join(unowned, " "))
		}
	}
	t.Logf("mapdump: %d mappings, %d owned, %d orphans, %d conflicts (records from %s)",
		len(doc.Mappings), count[cubelet.StatusOwned], count[cubelet.StatusOrphan], count[cubelet.StatusConflict], doc.Source)
}

// nodeFlags are the `cube node` flags that locate the chart's node state
// on the host: the chart's fixed paths and the release's values.
func nodeFlags(t *testing.T) []string {
	t.Helper()
	v := releaseValues(t)
	return []string{
		"--data-dir", "/var/lib/cube", "--run-dir", "/run/cube", "--envd", "/var/lib/cube/artifacts/envd",
		"--cgroup-parent", valueString(v, "cubeNode.cgroupParent"),
		"--node-cidr", valueString(v, "cubeNode.network.cidr"),
		"--port-range", valueString(v, "cubeNode.network.hostPortRange"),
	}
}

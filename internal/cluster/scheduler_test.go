package cluster

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func ready(id string) Candidate {
	return Candidate{ID: id, State: StateReady, HasTemplate: true, CPU: 16, MemoryMB: 16384, MaxSBX: 100, MaxCreates: 10}
}

func TestFilter(t *testing.T) {
	req := Request{Template: "base", CPU: 2, MemoryMB: 512}
	mod := func(f func(*Candidate)) Candidate { c := ready("n"); f(&c); return c }
	cases := []struct {
		name   string
		c      Candidate
		ok     bool
		reason string
	}{
		{"ready", ready("n"), true, ""},
		{"isolated", mod(func(c *Candidate) { c.State = StateIsolated }), false, "Isolated"},
		{"draining", mod(func(c *Candidate) { c.State = StateDraining }), false, "Draining"},
		{"down", mod(func(c *Candidate) { c.State = StateDown }), false, "Down"},
		{"no template", mod(func(c *Candidate) { c.HasTemplate = false }), false, "template"},
		{"fetchable template", mod(func(c *Candidate) { c.HasTemplate = false; c.Fetchable = true }), true, ""},
		{"count full", mod(func(c *Candidate) { c.Sandboxes = 99; c.Inflight = 1 }), false, "limit"},
		{"create concurrency", mod(func(c *Candidate) { c.Inflight = 10 }), false, "in flight"},
		{"cpu full", mod(func(c *Candidate) { c.UsedCPU = 15 }), false, "cpu"},
		{"cpu exactly fits", mod(func(c *Candidate) { c.UsedCPU = 14 }), true, ""},
		{"memory full", mod(func(c *Candidate) { c.UsedMemMB = 16000 }), false, "memory"},
		{"unlimited capacity", Candidate{ID: "n", State: StateReady, HasTemplate: true}, true, ""},
	}
	for _, c := range cases {
		ok, rej := Filter([]Candidate{c.c}, req)
		if (len(ok) == 1) != c.ok {
			t.Errorf("%s: feasible=%v, want %v (%v)", c.name, len(ok) == 1, c.ok, rej)
		}
		if !c.ok && !strings.Contains(rej["n"], c.reason) {
			t.Errorf("%s: reason %q should mention %q", c.name, rej["n"], c.reason)
		}
	}
}

func TestPickPrefersLocalityThenSpreadThenID(t *testing.T) {
	req := Request{Template: "base", CPU: 1, MemoryMB: 256}
	busy := ready("a")
	busy.UsedCPU, busy.UsedMemMB, busy.Sandboxes = 8, 8192, 50
	idle := ready("b")
	if got, _ := Pick([]Candidate{busy, idle}, req); got != "b" {
		t.Errorf("spread: got %s, want the idle node b", got)
	}
	noTpl := ready("c")
	noTpl.HasTemplate, noTpl.Fetchable = false, true
	if got, _ := Pick([]Candidate{noTpl, busy}, req); got != "a" {
		t.Errorf("locality: got %s, want a (has the template)", got)
	}
	if got, _ := Pick([]Candidate{ready("z"), ready("y")}, req); got != "y" {
		t.Errorf("tie: got %s, want lowest id y", got)
	}
}

func TestPickNoNode(t *testing.T) {
	_, err := Pick(nil, Request{Template: "base"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("no nodes: %v", err)
	}
	down := ready("n1")
	down.State = StateDown
	_, err = Pick([]Candidate{down}, Request{Template: "base"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "n1: node is Down") {
		t.Fatalf("all rejected: %v", err)
	}
}

// TestReserveUnderConcurrency places 200 creates at once on two nodes with
// room for 150 and checks the accounting never oversubscribes a node.
func TestReserveUnderConcurrency(t *testing.T) {
	r := NewRegistry(Config{ServerVersion: "v0.1.0"}, nil, nil)
	for _, id := range []string{"n1", "n2"} {
		r.nodes[id] = &node{rec: NodeRecord{ID: id, Capacity: Capacity{CPUCount: 150, MemoryMB: 1 << 20, MaxSandboxes: 75, MaxCreates: 200},
			Templates: []TemplateRef{{Name: "base"}}}}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	placed, refused, failed := map[string]int{}, 0, 0
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n, _, release, err := r.reserve("sb"+string(rune('a'+i%26))+string(rune('a'+i/26)), Request{Template: "base", CPU: 2, MemoryMB: 256}, supply{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if !errors.Is(err, errdefs.ErrResourceExhausted) {
					t.Errorf("reserve: %v", err)
				}
				refused++
				return
			}
			ok := i%10 != 0 // every tenth create fails and gives its capacity back
			if ok {
				placed[n.rec.ID]++
			} else {
				failed++
			}
			release(ok)
		}(i)
	}
	wg.Wait()
	if placed["n1"] > 75 || placed["n2"] > 75 || placed["n1"]+placed["n2"]+refused+failed != 200 {
		t.Fatalf("placed %v refused %d failed %d", placed, refused, failed)
	}
	for _, id := range []string{"n1", "n2"} {
		n := r.nodes[id]
		if n.inflight != 0 || n.usedCPU != 2*n.count || n.count > 75 || n.count != placed[id] {
			t.Errorf("%s: inflight %d usedCPU %d count %d", id, n.inflight, n.usedCPU, n.count)
		}
	}
}

// Usage-based memory: a node keeps its reserve free by what its sandboxes
// use, counting the creates since its last report at the per-sandbox
// average; nominal sizes do not matter when no nominal capacity is set.
func TestFilterByReportedMemory(t *testing.T) {
	req := Request{Template: "base", CPU: 2, MemoryMB: 512}
	node := func(availMB int64, count, atReport int) Candidate {
		return Candidate{ID: "n", State: StateReady, HasTemplate: true, MemReserveMB: 1000, Sandboxes: count,
			Usage: &NodeUsage{MemoryAvailableMB: availMB, SandboxResidentMB: 10 * 20, Sandboxes: 10, countAtReport: atReport}}
	}
	cases := []struct {
		name   string
		c      Candidate
		ok     bool
		reason string
	}{
		// 20 MiB per sandbox: 2000-20 >= 1000.
		{"room", node(2000, 10, 10), true, ""},
		// 50 creates since the report at 20 MiB: 2000-1000-20 < 1000.
		{"creates since the report", node(2000, 60, 10), false, "--memory-reserve-mb"},
		{"reserve reached", node(1010, 10, 10), false, "must stay free"},
		{"sandboxes ended since", node(2000, 0, 10), true, ""},
		{"no report", Candidate{ID: "n", State: StateReady, HasTemplate: true, MemReserveMB: 1000}, true, ""},
		{"no reserve", mod(node(10, 10, 10), func(c *Candidate) { c.MemReserveMB = 0 }), true, ""},
		// 2-vCPU sandboxes far past the node's cores: no nominal cpu
		// capacity set, so only usage counts.
		{"nominal cpu unlimited", mod(node(20000, 400, 400), func(c *Candidate) { c.UsedCPU = 800 }), true, ""},
	}
	for _, c := range cases {
		ok, rej := Filter([]Candidate{c.c}, req)
		if (len(ok) == 1) != c.ok {
			t.Errorf("%s: feasible=%v, want %v (%v)", c.name, len(ok) == 1, c.ok, rej)
		}
		if !c.ok && !strings.Contains(rej["n"], c.reason) {
			t.Errorf("%s: reason %q should mention %q", c.name, rej["n"], c.reason)
		}
	}
}

func mod(c Candidate, f func(*Candidate)) Candidate { f(&c); return c }

// Every rejection names the cubelet flag that raises the limit, since the
// message reaches the API client in the 503.
func TestRejectionsNameTheirFlag(t *testing.T) {
	req := Request{Template: "base", CPU: 2, MemoryMB: 512}
	for flag, c := range map[string]Candidate{
		"--max-sandboxes":     mod(ready("n"), func(c *Candidate) { c.Sandboxes = 100 }),
		"--max-creates":       mod(ready("n"), func(c *Candidate) { c.Inflight = 10 }),
		"--cpu-overcommit":    mod(ready("n"), func(c *Candidate) { c.UsedCPU = 16 }),
		"--memory-overcommit": mod(ready("n"), func(c *Candidate) { c.UsedMemMB = 16384 }),
		"--memory-reserve-mb": mod(ready("n"), func(c *Candidate) { c.MemReserveMB = 100; c.Usage = &NodeUsage{MemoryAvailableMB: 50} }),
	} {
		_, err := Pick([]Candidate{c}, req)
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: %v", flag, err)
		}
	}
}

// A node whose sandboxes keep its CPU busy loses to an idle one.
func TestScorePrefersIdleCPU(t *testing.T) {
	req := Request{Template: "base", CPU: 2, MemoryMB: 512}
	busy, idle := ready("a"), ready("b")
	busy.Usage = &NodeUsage{CPUs: 2, CPUUsedMilli: 1900}
	idle.Usage = &NodeUsage{CPUs: 2, CPUUsedMilli: 100}
	if got, _ := Pick([]Candidate{busy, idle}, req); got != "b" {
		t.Errorf("got %s, want the idle node b", got)
	}
}

// TestPickPrefersNodesHoldingLayers: short of a node holding the template,
// the scheduler prefers the node holding more of its layer stack (it
// fetches less), and a node holding none of it is fetchable only when the
// server also ships the bottom layer's template.
func TestPickPrefersNodesHoldingLayers(t *testing.T) {
	stack := []string{"sha256:base", "sha256:mid", "sha256:top"}
	refs := map[string][]TemplateRef{
		"none": nil,
		"base": {{Name: "base", Digest: "sha256:base"}},
		"mid":  {{Name: "base", Digest: "sha256:base"}, {Name: "midtpl", Digest: "sha256:x", Layers: stack[:2]}},
		// A sibling holds the bottom layer only inside its own rootfs.
		"other": {{Name: "other", Digest: "sha256:other", Layers: []string{"sha256:base", "sha256:zzz"}}},
	}
	for ref, want := range map[string]int{"none": 0, "base": 1, "mid": 2, "other": 0} {
		if got := heldLayers(refs[ref], stack); got != want {
			t.Errorf("heldLayers(%s) = %d, want %d", ref, got, want)
		}
	}
	cand := func(id string, held int) Candidate {
		sup := supply{server: true, layers: stack}
		return Candidate{ID: id, State: StateReady, CPU: 8, MemoryMB: 8192, LayersHeld: held, LayersTotal: len(stack), Fetchable: sup.fetchableBy(held)}
	}
	req := Request{Template: "top", CPU: 1, MemoryMB: 256}
	// "b" sorts after "a" and has slightly less room: only its layers can win.
	a, b := cand("a", 1), cand("b", 2)
	b.UsedCPU = 1
	if got, err := Pick([]Candidate{a, b}, req); err != nil || got != "b" {
		t.Fatalf("Pick = %q, %v; want b (holds two of three layers)", got, err)
	}
	if _, err := Pick([]Candidate{cand("n", 0)}, req); err == nil {
		t.Fatal("a node holding none of the stack was picked although the server lacks the base template")
	}
	if !(supply{server: true, layers: stack, baseOnServer: true}).fetchableBy(0) {
		t.Fatal("with the base template on the server, a bare node can fetch the stack")
	}
	if (supply{}).fetchableBy(3) {
		t.Fatal("a template the server does not ship is fetchable")
	}
}

package cubelet

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/shim"
)

// This file is where the cubelet decides whether a sandbox (or a
// pre-started pool slot) still runs. Reconcile, the periodic sweep of dead
// sandboxes (maintain.go), Inspect and the warm pool all ask here.
//
// A sandbox lives as long as its supervisor: the process `cube shim`
// becomes once the sandbox is ready (package supervisor), the parent of the
// sandbox's init. It records its pid in shim.json in the sandbox's state
// dir and answers GET /state on shim.sock there. Three checks, from the
// most to the least authoritative:
//
//   - probe: open a pidfd on the recorded pid (a reused pid cannot pass for
//     it), then ask the supervisor for its state (nsrt.Attach). Dead when no
//     supervisor was recorded, its process is gone, or it reports that the
//     init exited; alive when the init runs; unknown when it does not answer
//     within probeTimeout, the caller's context ended, or its record is
//     unreadable. Only dead condemns a sandbox: a busy or stopped supervisor
//     still holds a live one, and a sandbox must outlive its agent.
//   - watch: once a probe found a supervisor alive, its pidfd is kept
//     (shimWatches); later checks poll the kernel instead of calling it, and
//     only a watch that saw the process exit leads to a new probe.
//   - process identity: a pre-started slot remembers its supervisor's pid
//     and start time and its init's network namespace; a take checks them
//     in /proc (poolSlot.alive), with no round trip, and drops a dead slot.
//
// A plain pool slot runs nothing: it is alive while its record, completion
// file and endpoint are (reconcilePool).

// liveness is what a check found of a sandbox's supervisor.
type liveness int

const (
	// livenessUnknown: no answer within probeTimeout, the probe was
	// cancelled, or the supervisor's record is unreadable. Nothing may be
	// torn down on it.
	livenessUnknown liveness = iota
	livenessAlive
	// livenessDead: no supervisor process (or none was ever recorded), or
	// it reports that its sandbox ended.
	livenessDead
)

func (l liveness) String() string {
	switch l {
	case livenessAlive:
		return "alive"
	case livenessDead:
		return "dead"
	}
	return "unknown"
}

// probeTimeout bounds the probe of one supervisor.
const probeTimeout = 2 * time.Second

// keepRecord reports whether a sandbox record survives a check that found
// l: a running sandbox whose supervisor is not known to be dead. A record
// left creating or deleting outside a create or kill (a crash cut it
// short) never survives. Pool slots are judged by reconcilePool instead.
func keepRecord(r nodestore.Sandbox, l liveness) bool {
	return r.State == nodestore.StateRunning && l != livenessDead
}

// probed is what a probe learned of a supervisor it found alive.
type probed struct {
	initPID, shimPID int
	// watch is a watch on the supervisor's process when the probe was asked
	// for one (nil if it could not be made).
	watch *shim.ExitWatch
}

// probe asks the supervisor recorded in stateDir for its sandbox's state,
// bounded by probeTimeout.
func probe(ctx context.Context, stateDir string, wantWatch bool) (liveness, probed) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	sb, err := nsrt.Attach(ctx, stateDir)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) && ctx.Err() == nil {
			return livenessDead, probed{}
		}
		return livenessUnknown, probed{}
	}
	defer sb.Close()
	if !sb.AttachState().Running { // Attach asked the supervisor already
		return livenessDead, probed{}
	}
	p := probed{initPID: sb.InitPID(), shimPID: sb.ShimPID()}
	if wantWatch {
		p.watch, _ = sb.ExitWatch()
	}
	return livenessAlive, p
}

// livenessOf checks the sandbox whose runtime is called name: a watched
// supervisor that has not exited is alive without a call; otherwise it is
// probed, and watched from then on when it answers.
func (c *Cubelet) livenessOf(ctx context.Context, name string) liveness {
	if c.watches.alive(name) {
		return livenessAlive
	}
	c.probes.Add(1)
	l, p := probe(ctx, c.sandboxDir(name), true)
	if p.watch != nil {
		c.watches.put(name, p.watch)
	}
	return l
}

// livenessOfRunning checks every running sandbox of owners, a few at a
// time (a probe is a unix-socket round trip), so a restart with hundreds
// of sandboxes is not serialised on them. Records in other states are not
// checked (their entry is livenessUnknown).
func (c *Cubelet) livenessOfRunning(ctx context.Context, owners map[string]nodestore.Sandbox) map[string]liveness {
	const workers = 16
	ids := make(chan string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	live := map[string]liveness{}
	for range workers {
		wg.Go(func() {
			for id := range ids {
				l := c.livenessOf(ctx, owners[id].Runtime())
				mu.Lock()
				live[id] = l
				mu.Unlock()
			}
		})
	}
	for id, r := range owners {
		if r.State == nodestore.StateRunning {
			ids <- id
		}
	}
	close(ids)
	wg.Wait()
	return live
}

// slotProcs returns the init pid and supervisor of a pre-started slot whose
// sandbox runs, or zeros (dead, or not answering: the slot is dropped
// either way, a create would not get a working sandbox from it).
func (c *Cubelet) slotProcs(ctx context.Context, id string) (int, procID) {
	l, p := probe(ctx, c.sandboxDir(id), false)
	if l != livenessAlive {
		return 0, procID{}
	}
	return p.initPID, procOf(p.shimPID)
}

// shimWatches holds a pidfd of every supervisor a probe found alive, by
// runtime name. The sweep of dead sandboxes (every MaintainInterval, over
// every running sandbox) then polls the kernel for a watched supervisor
// instead of calling it: with 500 sandboxes the round trips woke every
// supervisor 2000 times a minute. A watched supervisor that has not exited
// counts as alive, like one that answers; one that has exited, or is not
// watched yet, gets the full probe, and only that probe can call a
// sandbox dead.
type shimWatches struct {
	mu sync.Mutex
	m  map[string]*shim.ExitWatch
}

// alive reports whether name's supervisor is watched and has not exited;
// a watch whose process exited is dropped.
func (w *shimWatches) alive(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	x, ok := w.m[name]
	if !ok {
		return false
	}
	if !x.Exited() {
		return true
	}
	x.Close()
	delete(w.m, name)
	return false
}

// put watches name's supervisor with x, replacing any older watch.
func (w *shimWatches) put(name string, x *shim.ExitWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]*shim.ExitWatch{}
	}
	if old, ok := w.m[name]; ok {
		old.Close()
	}
	w.m[name] = x
}

// forget stops watching name's supervisor (its sandbox or slot is torn
// down).
func (w *shimWatches) forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if x, ok := w.m[name]; ok {
		x.Close()
		delete(w.m, name)
	}
}

// closeAll releases every watch.
func (w *shimWatches) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, x := range w.m {
		x.Close()
		delete(w.m, name)
	}
}

// procID identifies a process: pid and start time (which tells it from a
// later process with the same pid).
type procID struct {
	pid   int
	start string
}

// procOf returns the identity of pid, or a zero procID.
func procOf(pid int) procID {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if pid <= 0 || err != nil {
		return procID{}
	}
	// Fields after the command (which may hold spaces) start after ')':
	// the state (field 3) first, the start time (field 22) 20th. A zombie
	// is dead.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return procID{}
	}
	return procID{pid: pid, start: f[19]}
}

// nsID identifies a namespace (device and inode of its nsfs file).
type nsID struct{ dev, ino uint64 }

// netnsOf returns the network namespace of pid, or a zero nsID.
func netnsOf(pid int) nsID {
	var st unix.Stat_t
	if pid <= 0 || unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st) != nil {
		return nsID{}
	}
	return nsID{dev: st.Dev, ino: st.Ino}
}

// alive reports whether a pre-started slot's init and supervisor still
// run, by their identities in /proc: a slot may wait in the pool for a
// long time, and a take must not call its supervisor to know.
func (s poolSlot) alive() bool {
	return s.initNS != (nsID{}) && netnsOf(s.initPID) == s.initNS &&
		s.shim != (procID{}) && procOf(s.shim.pid) == s.shim
}

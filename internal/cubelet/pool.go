package cubelet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/template"
)

// The warm pool keeps slots: the create pipeline (pipeline.go) run ahead
// of time, for no sandbox yet, so a create skips its slowest steps. A slot
// is an owner record (state "pooled", id "pool-<hex>") owning an IP, a
// pinned netns with its veth in the dataplane and the default egress
// policy (slotEgress), plus either
//
//   - (plain slot, stage "disk") when disks are limited, a formatted disk
//     image in its state dir, or
//   - (pre-started slot, stage "launch", Config.PoolPrestart) a running
//     sandbox of the pool template (Config.PoolTemplate, default
//     CPU/memory/disk) whose envd listens but is unconfigured: it accepts
//     only the slot's own access token and no host port is mapped to it.
//
// Every runtime object of a slot is named by the slot's id, and keeps that
// name for life: a create takes a slot by replacing its record with the
// sandbox's in one transaction (whose RuntimeID is the slot's id) and
// resumes the pipeline after the slot's stage; nothing is renamed. The
// stage is recorded in the slot's file (slotFile.Stage). An empty pool
// never blocks a create: it runs the whole pipeline. Slots are reconciled
// like sandboxes (see reconcilePool).

// poolPrefix marks slot ids; sandbox ids never start with it (the master
// generates [a-z0-9]{20}).
const poolPrefix = "pool-"

// poolDiskSizeMB is the disk size plain slots are pre-formatted for: the
// template default. A sandbox of another size runs the disk step again.
const poolDiskSizeMB = template.DefaultDiskSizeMB

// poolSlot is a ready slot as the pool keeps it in memory.
type poolSlot struct {
	rec nodestore.Sandbox
	// stage is the last pipeline step the slot ran (stagePlain,
	// stagePrestarted): a create resumes after it.
	stage int
	// digest is the template content a pre-started slot runs.
	digest string
	// token is the access token of a pre-started slot's unconfigured envd.
	token string
	// initPID is the host pid of a pre-started slot's init, and initNS
	// the identity of its network namespace (which tells a live init from
	// a reused pid).
	initPID int
	initNS  nsID
	// shim is the slot's shim process (pid and start time).
	shim procID
	// stamp is the runtime stamp the slot was made under (RuntimeInfo).
	stamp string
	// started identifies the start and ready commands a slot of stage
	// stageStarted ran (startKey; empty for other slots).
	started string
}

// discardSlot sets a slot that cannot be used aside for the refill loop
// to drop, logging why (msg, with attrs).
func (c *Cubelet) discardSlot(s poolSlot, msg string, attrs ...any) {
	c.log.Warn(msg, append([]any{"slot", s.rec.ID, "template", s.rec.Template}, attrs...)...)
	c.pool.mu.Lock()
	c.pool.stale = append(c.pool.stale, s)
	c.pool.mu.Unlock()
	c.kickPool()
}

// prestarted reports whether the slot runs a sandbox already.
func (s poolSlot) prestarted() bool { return s.stage >= stepLaunch }

// slotFile is the copy of a slot's record kept in <state>/pool/<id>.img.json,
// written last: it marks the slot complete. It decodes as a
// nodestore.Sandbox for operator tools.
type slotFile struct {
	nodestore.Sandbox
	// Stage names the last pipeline step the slot ran. A file without
	// one was written by an earlier version (whose plain slots kept their
	// disk elsewhere and had no egress policy): such slots are recycled.
	Stage          string `json:"stage,omitempty"`
	TemplateDigest string `json:"templateDigest,omitempty"`
	EnvdToken      string `json:"envdToken,omitempty"`
	// Stamp is the runtime stamp the slot was made under; a cubelet of
	// another runtime (version or binaries) drops the slot at start.
	Stamp string `json:"stamp,omitempty"`
	// StartCmd is poolSlot.started: the start command a slot of stage
	// "start" runs.
	StartCmd string `json:"startCmd,omitempty"`
}

type pool struct {
	mu       sync.Mutex
	ready    []poolSlot
	stale    []poolSlot     // slots to drop: of a replaced template, or whose sandbox died
	building map[string]int // slots being made, per target (pooltargets.go)
	// missing holds targets whose template the node lacked, or whose
	// template's start command failed in a slot (poolstart.go), until
	// when they are skipped.
	missing map[string]time.Time
	// startFails counts a target's slot start failures in a row (nil
	// until the first).
	startFails map[string]int
	kick       chan struct{}
	// creating counts creates in flight: a refill waits for a quiet
	// moment (at most refillYield) so it does not take CPU from them.
	creating inflight
	// demand counts creates per template for the adaptive pool
	// (pooldemand.go); nil when the pool size is fixed.
	demand *demand
	// costs is what a slot of each target measured (poolcost.go).
	costs slotCosts
}

// refillYield is the longest a refill waits for creates in flight to end
// before it makes a slot anyway (under sustained load the pool must still
// refill, or every create goes cold).
const refillYield = 250 * time.Millisecond

// yieldToCreates waits until no create is in flight, at most refillYield.
func (c *Cubelet) yieldToCreates(ctx context.Context) {
	t := time.NewTimer(refillYield)
	defer t.Stop()
	select {
	case <-c.pool.creating.quiet():
	case <-t.C:
	case <-ctx.Done():
	}
}

func isSlot(id string) bool { return strings.HasPrefix(id, poolPrefix) }

func (c *Cubelet) poolDir() string { return filepath.Join(c.cfg.StateDir, "pool") }

// slotDisk is where an earlier version kept a plain slot's disk image;
// removed with the slot (a slot's image is in its state dir now).
func (c *Cubelet) slotDisk(id string) string { return filepath.Join(c.poolDir(), id+".img") }

// slotFilePath is the slot's completion file (slotFile).
func (c *Cubelet) slotFilePath(id string) string { return c.slotDisk(id) + ".json" }

func (c *Cubelet) kickPool() {
	select {
	case c.pool.kick <- struct{}{}:
	default:
	}
}

// takeSlot pops a ready slot for a sandbox of tmpl, if any, and asks for a
// refill: a pre-started slot running tmpl at its disk size first, else a
// plain slot. Pre-started slots of an older version of tmpl are set aside
// for the refill loop to drop.
func (c *Cubelet) takeSlot(tmpl template.Template) (poolSlot, bool) {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	defer c.kickPool()
	pick := -1
	for i := len(c.pool.ready) - 1; i >= 0; i-- {
		s := c.pool.ready[i]
		if s.prestarted() && s.rec.Template == tmpl.Name && (s.digest != tmpl.Digest || s.started != startKey(tmpl)) {
			c.pool.stale = append(c.pool.stale, s)
			c.pool.ready = append(c.pool.ready[:i], c.pool.ready[i+1:]...)
			if pick > i {
				pick--
			}
			continue
		}
		if s.prestarted() && c.slotFits(s, tmpl) {
			pick = i
			break
		}
		if !s.prestarted() && pick < 0 {
			pick = i
		}
	}
	if pick < 0 {
		return poolSlot{}, false
	}
	s := c.pool.ready[pick]
	c.pool.ready = append(c.pool.ready[:pick], c.pool.ready[pick+1:]...)
	return s, true
}

// slotFits reports whether a pre-started slot can become a sandbox of tmpl:
// same template content, start command and disk size (CPU and memory are
// set at take).
func (c *Cubelet) slotFits(s poolSlot, tmpl template.Template) bool {
	return s.rec.Template == tmpl.Name && s.digest == tmpl.Digest && s.started == startKey(tmpl) &&
		s.rec.DiskSizeMB == tmpl.DiskSizeMB
}

// PoolSize reports ready slots.
func (c *Cubelet) PoolSize() int {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	return len(c.pool.ready)
}

// poolWorkers is how many slots are made at once: a burst of creates
// empties the pool faster than one worker refills it.
func poolWorkers(size int) int { return max(1, min(size, runtime.NumCPU(), 4)) }

// runPool refills the pool up to its targets' sizes until ctx ends, with a
// few workers in parallel.
func (c *Cubelet) runPool(ctx context.Context) {
	var wg sync.WaitGroup
	for range poolWorkers(c.poolCapacity()) {
		wg.Go(func() { c.refill(ctx) })
	}
	wg.Wait()
}

func (c *Cubelet) refill(ctx context.Context) {
	for ctx.Err() == nil {
		c.pool.mu.Lock()
		if n := len(c.pool.stale); n > 0 {
			s := c.pool.stale[n-1]
			c.pool.stale = c.pool.stale[:n-1]
			c.pool.mu.Unlock()
			if err := c.dropSlot(context.WithoutCancel(ctx), s.rec); err != nil {
				// Retried: a shim that is still exiting answers neither
				// way for a moment.
				c.log.Warn("warm pool: drop slot; retrying", "slot", s.rec.ID, "err", err)
				c.pool.mu.Lock()
				c.pool.stale = append(c.pool.stale, s)
				c.pool.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
			continue
		}
		if c.trimLocked(time.Now()) {
			c.pool.mu.Unlock()
			continue
		}
		target, need, wake := c.nextTargetLocked(time.Now())
		if need <= 0 {
			c.pool.mu.Unlock()
			if !c.waitForPoolWork(ctx, wake) {
				return
			}
			continue
		}
		c.pool.building[target]++
		c.pool.mu.Unlock()
		if need > 1 {
			c.kickPool() // wake another worker
		}
		c.yieldToCreates(ctx)
		// A slot is made in a create turn: creates waiting for one are
		// ahead of it, and slots never add to the creates running at
		// once (Config.CreateParallelism).
		var slot poolSlot
		endTurn, err := c.takeTurn(ctx)
		if err == nil {
			endTurn = sync.OnceFunc(endTurn) // a slot's start step ends it early
			slot, err = c.makeSlot(ctx, target, endTurn)
			endTurn()
		}
		c.pool.mu.Lock()
		c.pool.building[target]--
		if errors.Is(err, errTemplateNotHere) {
			c.pool.missing[target] = time.Now().Add(poolTemplateRetry)
			c.pool.mu.Unlock()
			c.log.Debug("warm pool: template not on this node yet", "template", target)
			continue
		}
		if c.slotStartFailedLocked(target, err) {
			c.pool.mu.Unlock()
			continue
		}
		delete(c.pool.missing, target)
		switch {
		case err == nil && slot.stamp != c.stamp():
			// The binaries changed while it was made (refreshRuntime).
			c.pool.stale = append(c.pool.stale, slot)
		case err == nil:
			c.pool.ready = append(c.pool.ready, slot)
		}
		c.pool.mu.Unlock()
		if err == nil {
			c.measureSlot(slot)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("warm pool: make slot", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// waitForPoolWork waits for a kick, or until wake when it is set; false
// when ctx ended.
func (c *Cubelet) waitForPoolWork(ctx context.Context, wake time.Time) bool {
	var retry <-chan time.Time
	if !wake.IsZero() {
		t := time.NewTimer(time.Until(wake))
		defer t.Stop()
		retry = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-c.pool.kick:
	case <-retry:
	}
	return true
}

// makeSlot provisions one slot for target: the pipeline up to
// stagePrestarted when configured and the template is available, else (the
// main target only) up to stagePlain, then the slot file that marks it
// complete. A failure undoes it all. A PoolTemplates target whose template
// is not on the node fails with errTemplateNotHere. endTurn, when not nil,
// ends the caller's create turn once only waiting is left (poolstart.go).
func (c *Cubelet) makeSlot(ctx context.Context, target string, endTurn func()) (poolSlot, error) {
	var tmpl template.Template
	if target != mainTarget {
		var err error
		if tmpl, err = c.templates.Get(ctx, target); errors.Is(err, errdefs.ErrNotFound) {
			return poolSlot{}, fmt.Errorf("%s: %w", target, errTemplateNotHere)
		} else if err != nil {
			return poolSlot{}, err
		}
	} else if c.cfg.PoolPrestart {
		var err error
		tmpl, err = c.template(ctx, c.poolTemplate())
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return poolSlot{}, err
		}
		if err != nil {
			c.log.Warn("warm pool: pool template missing; making a plain slot", "template", c.poolTemplate(), "err", err)
		}
	}
	stamp := c.stamp() // before: binaries replaced meanwhile make the slot stale
	b := &build{c: c, kind: "slot", ahead: true, tmpl: tmpl, endTurn: endTurn,
		rec: nodestore.Sandbox{ID: poolPrefix + randomHex(6), State: nodestore.StatePooled, CreatedAt: time.Now().UTC()}}
	stage := stagePlain
	if tmpl.Name != "" {
		stage = stagePrestarted
		if hasStartCmd(tmpl) {
			stage = stageStarted
		}
		b.rec.Template = tmpl.Name
		b.rec.CPUCount, b.rec.MemoryMB, b.rec.DiskSizeMB = tmpl.CPUCount, tmpl.MemoryMB, tmpl.DiskSizeMB
		b.rec.EnvdVersion = c.cfg.EnvdVersion
		b.token = randomHex(32) // may become the sandbox's envd token (see personalise)
	} else {
		b.rec.DiskSizeMB = poolDiskSizeMB
	}
	if err := b.run(ctx, stage); err != nil {
		if b.reached == stepStart && ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", errSlotStart, err)
		}
		return poolSlot{}, err
	}
	s := poolSlot{rec: b.rec, stage: stage, digest: tmpl.Digest, token: b.token,
		initPID: b.initPID, initNS: netnsOf(b.initPID), shim: b.shim, stamp: stamp, started: startKey(tmpl)}
	if err := c.writeSlotFile(s); err != nil {
		b.undo(ctx)
		return poolSlot{}, err
	}
	return s, nil
}

func (c *Cubelet) poolTemplate() string { return poolTemplateOf(c.cfg) }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

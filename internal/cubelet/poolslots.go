package cubelet

// A slot's files, its removal, and what start-up does with the slots a
// previous run left (see pool.go for what a slot is).

import (
	"context"
	"encoding/json"
	"errors"
	"os"

	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// dropSlot removes a slot's sandbox (if pre-started), kernel objects,
// files and record.
func (c *Cubelet) dropSlot(ctx context.Context, rec nodestore.Sandbox) error {
	c.watches.forget(rec.ID)
	err := errors.Join(
		nsrt.Cleanup(ctx, c.sandboxDir(rec.ID), c.cfg.CgroupParent, rec.ID),
		c.dp.Detach(ctx, rec.ID))
	os.Remove(c.slotDisk(rec.ID))
	os.Remove(c.slotFilePath(rec.ID))
	if err != nil {
		return err
	}
	return c.store.Delete(rec.ID)
}

// writeSlotFile keeps a copy of the slot record next to its disk, so
// operator tools can tell pool slots from orphans while the store is held.
// It is written last and marks the slot complete.
func (c *Cubelet) writeSlotFile(s poolSlot) error {
	if err := os.MkdirAll(c.poolDir(), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(slotFile{Sandbox: s.rec, Stage: createSteps[s.stage].name,
		TemplateDigest: s.digest, EnvdToken: s.token, Stamp: s.stamp, StartCmd: s.started})
	if err != nil {
		return err
	}
	return os.WriteFile(c.slotFilePath(s.rec.ID), data, 0o600)
}

// readSlotFile reads a slot's completion file back.
func (c *Cubelet) readSlotFile(id string) (slotFile, error) {
	var f slotFile
	data, err := os.ReadFile(c.slotFilePath(id))
	if err != nil {
		return f, err
	}
	return f, json.Unmarshal(data, &f)
}

// DrainPool removes every ready slot (clean shutdown, tests).
func (c *Cubelet) DrainPool(ctx context.Context) error {
	c.pool.mu.Lock()
	slots := append(c.pool.ready, c.pool.stale...)
	c.pool.ready, c.pool.stale = nil, nil
	c.pool.mu.Unlock()
	var errs []error
	for _, s := range slots {
		errs = append(errs, c.dropSlot(ctx, s.rec))
	}
	return errors.Join(errs...)
}

// reconcilePool keeps complete slots whose endpoint survived (and, when
// pre-started, whose sandbox still runs) and drops the rest. Slots made
// under another runtime stamp (an earlier version or other binaries: their
// supervisor, init and envd would run the old code for as long as the
// sandbox made from them lives) are dropped too and listed in recycled; the
// pool makes new ones.
func (c *Cubelet) reconcilePool(ctx context.Context, slots []nodestore.Sandbox, endpoints map[string]bool) (kept int, recycled []string) {
	c.pool.mu.Lock()
	c.pool.ready, c.pool.stale = nil, nil
	c.pool.mu.Unlock()
	plainWanted := c.plainSlotsWanted(ctx)
	for _, rec := range slots {
		// The record copy is written last: without it the slot was cut
		// short (its disk image may be half formatted, its sandbox half
		// started).
		f, doneErr := c.readSlotFile(rec.ID)
		ok := endpoints[rec.ID] && doneErr == nil && f.ID == rec.ID
		stage, staged := slotStage(f.Stage)
		if cur := c.stamp(); ok && (!staged || cur != "" && f.Stamp != cur) {
			c.log.Info("warm pool: slot made by another runtime; replacing it", "slot", rec.ID, "stamp", f.Stamp,
				"stage", f.Stage, "current", cur)
			recycled = append(recycled, rec.ID)
			ok = false
		}
		var pid int
		var shim procID
		if ok && stage >= stepLaunch {
			pid, shim = c.slotProcs(ctx, rec.ID)
			ok = f.EnvdToken != "" && pid > 0
		}
		s := poolSlot{rec: rec, stage: stage, digest: f.TemplateDigest, token: f.EnvdToken,
			initPID: pid, initNS: netnsOf(pid), shim: shim, stamp: f.Stamp, started: f.StartCmd}
		if ok && !c.wantedSlot(s, plainWanted) {
			c.log.Info("warm pool: a kind of slot the pool no longer makes; dropping it", "slot", rec.ID, "template", rec.Template,
				"stage", f.Stage)
			ok = false
		}
		if ok {
			c.pool.mu.Lock()
			c.pool.ready = append(c.pool.ready, s)
			c.pool.mu.Unlock()
			kept++
			continue
		}
		if err := c.dropSlot(ctx, rec); err != nil {
			c.log.Warn("drop broken pool slot", "slot", rec.ID, "err", err)
		}
	}
	return kept, recycled
}

// recyclePool sets every ready slot not made under stamp aside for the
// refill loop to drop, and returns how many.
func (c *Cubelet) recyclePool(stamp string) int {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	kept := c.pool.ready[:0]
	n := 0
	for _, s := range c.pool.ready {
		if s.stamp == stamp {
			kept = append(kept, s)
			continue
		}
		c.pool.stale = append(c.pool.stale, s)
		n++
	}
	c.pool.ready = kept
	if n > 0 {
		c.kickPool()
	}
	return n
}

func (c *Cubelet) isReady(id string) bool {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	for _, s := range c.pool.ready {
		if s.rec.ID == id {
			return true
		}
	}
	return false
}

// returnSlot puts back a slot a create took but did not use.
func (c *Cubelet) returnSlot(s poolSlot) {
	c.pool.mu.Lock()
	c.pool.ready = append(c.pool.ready, s)
	c.pool.mu.Unlock()
}

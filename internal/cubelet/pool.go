package cubelet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// The warm pool keeps pre-provisioned slots so a create skips the slowest
// cold steps. A slot is an owner record (state "pooled", id "pool-<hex>")
// owning an IP, a pinned netns with its veth in the dataplane and, when
// disks are limited, a formatted disk image in <state>/pool/<id>.img. A
// create takes a slot: its record is replaced by the sandbox's in one
// transaction and the endpoint is renamed to the sandbox (cubevs.Rename),
// so afterwards every kernel object carries the sandbox's id. An empty pool
// never blocks a create: it takes the cold path. Slots are reconciled like
// sandboxes (see reconcilePool).

// poolPrefix marks slot ids; sandbox ids never start with it (the master
// generates [a-z0-9]{20}).
const poolPrefix = "pool-"

// poolDiskSizeMB is the disk size slots are pre-formatted for: the template
// default. Sandboxes of other sizes format their own at start.
const poolDiskSizeMB = template.DefaultDiskSizeMB

type pool struct {
	mu       sync.Mutex
	ready    []nodestore.Sandbox
	building int
	kick     chan struct{}
}

func isSlot(id string) bool { return strings.HasPrefix(id, poolPrefix) }

func (c *Cubelet) poolDir() string { return filepath.Join(c.cfg.StateDir, "pool") }

func (c *Cubelet) slotDisk(id string) string { return filepath.Join(c.poolDir(), id+".img") }

// takeSlot pops a ready slot, if any, and asks for a refill.
func (c *Cubelet) takeSlot() (nodestore.Sandbox, bool) {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	select {
	case c.pool.kick <- struct{}{}:
	default:
	}
	if len(c.pool.ready) == 0 {
		return nodestore.Sandbox{}, false
	}
	s := c.pool.ready[len(c.pool.ready)-1]
	c.pool.ready = c.pool.ready[:len(c.pool.ready)-1]
	return s, true
}

// PoolSize reports ready slots.
func (c *Cubelet) PoolSize() int {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	return len(c.pool.ready)
}

// runPool refills the pool up to cfg.PoolSize until ctx ends.
func (c *Cubelet) runPool(ctx context.Context) {
	for {
		c.pool.mu.Lock()
		need := c.cfg.PoolSize - len(c.pool.ready)
		c.pool.mu.Unlock()
		if need <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-c.pool.kick:
			}
			continue
		}
		slot, err := c.makeSlot(ctx)
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
			continue
		}
		c.pool.mu.Lock()
		c.pool.ready = append(c.pool.ready, slot)
		c.pool.mu.Unlock()
	}
}

// makeSlot provisions one slot, recording it before any kernel object.
func (c *Cubelet) makeSlot(ctx context.Context) (rec nodestore.Sandbox, err error) {
	b := make([]byte, 6)
	rand.Read(b)
	rec = nodestore.Sandbox{ID: poolPrefix + hex.EncodeToString(b), State: nodestore.StatePooled, CreatedAt: time.Now().UTC()}
	c.mu.Lock()
	ips, _, err := c.taken(ctx)
	if err == nil {
		rec.IP, err = cubevs.NextFreeIP(c.cfg.Network.NodeCIDR, ips)
	}
	if err == nil {
		err = c.store.Put(rec)
	}
	c.mu.Unlock()
	if err != nil {
		return rec, err
	}
	defer func() {
		if err != nil {
			c.dropSlot(context.WithoutCancel(ctx), rec)
		}
	}()
	if _, err := c.dp.Attach(ctx, rec.ID, rec.IP); err != nil {
		return rec, err
	}
	if !c.cfg.NoDiskLimit {
		if err := os.MkdirAll(c.poolDir(), 0o700); err != nil {
			return rec, err
		}
		if err := nsrt.MakeDisk(c.slotDisk(rec.ID), poolDiskSizeMB); err != nil {
			return rec, err
		}
	}
	return rec, c.writeSlotFile(rec)
}

// dropSlot removes a slot's kernel objects, files and record.
func (c *Cubelet) dropSlot(ctx context.Context, rec nodestore.Sandbox) error {
	err := c.dp.Detach(ctx, rec.ID)
	os.Remove(c.slotDisk(rec.ID))
	os.Remove(c.slotDisk(rec.ID) + ".json")
	if err != nil {
		return err
	}
	return c.store.Delete(rec.ID)
}

// writeSlotFile keeps a copy of the slot record next to its disk, so
// operator tools can tell pool slots from orphans while the store is held.
// It is written last and marks the slot complete.
func (c *Cubelet) writeSlotFile(rec nodestore.Sandbox) error {
	if err := os.MkdirAll(c.poolDir(), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return os.WriteFile(c.slotDisk(rec.ID)+".json", data, 0o600)
}

// DrainPool removes every ready slot (clean shutdown, tests).
func (c *Cubelet) DrainPool(ctx context.Context) error {
	c.pool.mu.Lock()
	slots := c.pool.ready
	c.pool.ready = nil
	c.pool.mu.Unlock()
	var errs []error
	for _, s := range slots {
		errs = append(errs, c.dropSlot(ctx, s))
	}
	return errors.Join(errs...)
}

// reconcilePool keeps slots whose endpoint survived and drops the rest.
func (c *Cubelet) reconcilePool(ctx context.Context, slots []nodestore.Sandbox, endpoints map[string]bool) (kept int) {
	c.pool.mu.Lock()
	c.pool.ready = nil
	c.pool.mu.Unlock()
	for _, s := range slots {
		// The record copy is written last: without it the slot was cut
		// short (its disk image may be half formatted).
		_, doneErr := os.Stat(c.slotDisk(s.ID) + ".json")
		if endpoints[s.ID] && doneErr == nil {
			c.pool.mu.Lock()
			c.pool.ready = append(c.pool.ready, s)
			c.pool.mu.Unlock()
			kept++
			continue
		}
		if err := c.dropSlot(ctx, s); err != nil {
			c.log.Warn("drop broken pool slot", "slot", s.ID, "err", err)
		}
	}
	return kept
}

// preparedDisk names the slot's image for a sandbox of that disk size.
func (c *Cubelet) preparedDisk(slot nodestore.Sandbox, diskSizeMB int) string {
	if slot.ID == "" || diskSizeMB != poolDiskSizeMB || c.cfg.NoDiskLimit {
		return ""
	}
	return c.slotDisk(slot.ID)
}

func (c *Cubelet) isReady(id string) bool {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	for _, s := range c.pool.ready {
		if s.ID == id {
			return true
		}
	}
	return false
}

// returnSlot puts back a slot a create took but did not use.
func (c *Cubelet) returnSlot(s nodestore.Sandbox) {
	c.pool.mu.Lock()
	c.pool.ready = append(c.pool.ready, s)
	c.pool.mu.Unlock()
}

package cubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// The steps of the create pipeline (pipeline.go) and their undos, in order.
// The personalise step is in take.go.

// reserve allocates an IP and envd's host port and writes the owner record
// first: every kernel object made later is named by it (its Runtime(),
// fixed here) and a crash leaves something Reconcile finds. A slot made
// ahead of time reserves only an IP: host ports are held by mappings, and
// a slot has none. Resuming a slot, the sandbox takes the slot's IP and
// runtime name, and its record replaces the slot's in one transaction.
func (b *build) reserve(ctx context.Context) error {
	c := b.c
	if b.ahead {
		ip, err := c.addrs.TakeIP()
		if err == nil {
			b.rec.IP, b.rec.RuntimeID = ip, b.rec.ID
			err = c.store.Put(b.rec)
			c.addrs.ReleaseIP(ip) // the record holds it now (or failed)
		}
		if err != nil {
			return fmt.Errorf("reserve pool slot: %w", err)
		}
		b.owned = true
		return nil
	}
	var slot nodestore.Sandbox
	if b.from != nil {
		slot = b.from.rec
	}
	ip, hostPort, release, err := c.allocate(ctx, slot)
	if err != nil {
		b.giveBackSlot()
		return err
	}
	b.release, b.hostPort = release, hostPort
	b.rec.IP = ip
	b.rec.Ports = map[uint16]uint16{EnvdPort: hostPort}
	if b.from == nil {
		b.rec.RuntimeID = b.rec.ID
		err = c.store.Put(b.rec)
	} else {
		b.rec.RuntimeID = slot.ID
		err = c.store.PutReplacing(b.rec, slot.ID)
	}
	if err != nil {
		b.giveBackSlot()
		return fmt.Errorf("write owner record: %w", err)
	}
	b.owned = true
	if b.from != nil {
		// The slot is the sandbox's now, no longer a ready slot.
		removeQuietly(c.slotFilePath(slot.ID))
	}
	return nil
}

// giveBackSlot returns the slot a create could not take over to the pool.
func (b *build) giveBackSlot() {
	if b.from != nil {
		b.c.returnSlot(*b.from)
		b.from = nil
	}
}

// netnsPath is the pin of the network namespace of b's runtime.
func (b *build) netnsPath() string { return b.c.dp.Config().SandboxNetNSPath(b.rec.Runtime()) }

// attachNetwork gives the runtime a pinned netns joined to the dataplane
// by a veth, named by the runtime (cubevs.Attach).
func (b *build) attachNetwork(ctx context.Context) error {
	if _, err := b.c.dp.Attach(ctx, b.rec.Runtime(), b.rec.IP); err != nil {
		return fmt.Errorf("attach network: %w", err)
	}
	return nil
}

// detachNetwork removes the runtime's veth, netns pin and egress chain.
func (b *build) detachNetwork(ctx context.Context) error {
	return b.c.dp.Detach(ctx, b.rec.Runtime())
}

// slotEgress is the egress policy a slot gets ahead of time: a create's
// default (internet, no allow/deny lists), so a default create skips the
// egress step.
var slotEgress = cubevs.EgressPolicy{AllowInternet: true}

// setEgress installs the sandbox's egress policy (a slot's: slotEgress).
func (b *build) setEgress(ctx context.Context) error {
	p := slotEgress
	if !b.ahead {
		p = egressOf(b.rec)
	}
	if err := b.c.dp.SetEgress(ctx, b.rec.Runtime(), b.rec.IP, p); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	return nil
}

// makeDisk formats the writable layer's image in the runtime's state dir,
// where launch hands it to the shim (nsrt.Spec.PreparedDisk). It runs in
// the cubelet rather than in the shim so a plain slot can run it ahead of
// time, and with the cubelet's own mkfs when shims run on the host. The
// image is a copy of one formatted per size (nsrt.DiskCache), not a new
// mkfs per sandbox.
func (b *build) makeDisk(context.Context) error {
	dir := b.c.sandboxDir(b.rec.Runtime())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox state dir: %w", err)
	}
	if err := b.c.disks.Make(nsrt.DiskImagePath(dir), b.c.diskSizeMB(b.rec)); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	return nil
}

// removeDisk removes the disk image, and the state dir if that is all it
// held (launch's undo removes a launched one).
func (b *build) removeDisk(context.Context) error {
	dir := b.c.sandboxDir(b.rec.Runtime())
	if err := os.Remove(nsrt.DiskImagePath(dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	os.Remove(dir) // fails when not empty: not ours to remove then
	return nil
}

// launch starts the sandbox through a shim (cgroup, mounts, init) and
// returns once envd listens.
func (b *build) launch(ctx context.Context) error {
	c := b.c
	spec, err := c.runtimeSpec(b.rec, b.token, b.launchEnvVars(), b.tmpl.Defaults, b.tmpl.RootfsPath, b.netnsPath())
	if err != nil {
		return err
	}
	if spec.DiskSizeMB > 0 {
		spec.PreparedDisk = nsrt.DiskImagePath(spec.StateDir) // made by the disk step
	}
	sb, err := c.startSandbox(ctx, spec)
	if err != nil {
		return fmt.Errorf("start sandbox: %w", err)
	}
	defer sb.Close()
	if b.ahead {
		// A pre-started slot is checked before it is taken (poolSlot.alive).
		b.initPID, b.shim = sb.InitPID(), procOf(sb.ShimPID())
	}
	return nil
}

// stopLaunched kills the sandbox and removes its cgroup and state dir.
func (b *build) stopLaunched(ctx context.Context) error {
	rt := b.rec.Runtime()
	b.c.watches.forget(rt)
	return nsrt.Cleanup(ctx, b.c.sandboxDir(rt), b.c.cfg.CgroupParent, rt)
}

// mapEnvd maps envd's host port to the sandbox: from here on the sandbox
// is reachable from outside the node.
func (b *build) mapEnvd(ctx context.Context) error {
	m := cubevs.Mapping{Owner: b.rec.Runtime(), HostPort: b.hostPort, SandboxIP: b.rec.IP, GuestPort: EnvdPort}
	if err := b.c.dp.AddMapping(ctx, m); err != nil {
		return fmt.Errorf("map envd port: %w", err)
	}
	return nil
}

func (b *build) unmapEnvd(ctx context.Context) error {
	if b.hostPort == 0 {
		return nil
	}
	if err := b.c.dp.RemoveMapping(ctx, b.hostPort); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// recordRunning marks the record running (and copies it to the state dir,
// for a lost store): the sandbox is now the node's to keep.
func (b *build) recordRunning(context.Context) error {
	b.rec.State = nodestore.StateRunning
	if err := b.c.putRecord(b.rec); err != nil {
		return fmt.Errorf("record running sandbox: %w", err)
	}
	return nil
}

// removeQuietly removes a file that may not exist: nothing to do then, and
// a failure leaves a file that Reconcile's sweep removes.
func removeQuietly(path string) { os.Remove(path) }

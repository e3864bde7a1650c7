package cubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/failpoint"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// Destroy steps, in order, each a failpoint "destroy/<step>".
var DestroySteps = []string{"after-mark", "after-kill", "after-detach"}

// KillSandbox stops a sandbox and removes every kernel object it owned.
//
// It does so before it answers, with one exception: the sandbox's veth
// pair is destroyed by the kernel with the sandbox's netns once the kill
// has unpinned it (cubevs.Dataplane.Release), ~35 ms later in a kernel
// worker. Deleting the pair here cost 24-30 ms of every kill (RCU grace
// periods); the CPU is the same either way. Releasing the whole network,
// cgroup and state dir in the background was tried earlier and dropped:
// the releases moved their cost onto the next creates, and so does the
// kernel's netns teardown, to a lesser degree (docs/benchmarks.md,
// "Kill without deleting the veth pair").
func (c *Cubelet) KillSandbox(ctx context.Context, id string) error {
	unlock := c.lock(id)
	defer unlock()
	rec, err := c.store.Get(id)
	if err != nil {
		return err
	}
	start := time.Now()
	err = c.teardown(ctx, rec)
	c.metrics.killed(time.Since(start), err)
	return err
}

// teardown removes a sandbox's kernel objects in reverse order of creation
// and deletes its owner record last, all before it returns. It keeps going
// past failed steps and returns them joined; the record stays if anything
// is left, so the next retry (maintain, Reconcile) finishes it.
func (c *Cubelet) teardown(ctx context.Context, rec nodestore.Sandbox) error {
	st := newStepTimer()
	c.logEnded(ctx, rec)
	st.mark("logs")
	killErr, err := c.stop(ctx, rec)
	if err != nil {
		return err
	}
	st.mark("stop")
	return errors.Join(killErr, c.release(ctx, rec, st))
}

// stop marks the record deleting and kills the sandbox's processes. err
// means the teardown cannot go on (the record could not be marked); killErr
// that the kill failed, after which releasing the rest is still worth it.
func (c *Cubelet) stop(ctx context.Context, rec nodestore.Sandbox) (killErr, err error) {
	if rec.State != nodestore.StateDeleting {
		rec.State = nodestore.StateDeleting
		if err := c.store.Put(rec); err != nil {
			return nil, fmt.Errorf("mark sandbox deleting: %w", err)
		}
	}
	if err := failpoint.Hit("destroy/after-mark"); err != nil {
		return nil, err
	}
	rt := rec.Runtime()
	if sb, err := nsrt.Attach(ctx, c.sandboxDir(rt)); err == nil {
		if err := sb.Kill(ctx); err != nil {
			killErr = fmt.Errorf("kill sandbox: %w", err)
		}
	} else if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
		killErr = fmt.Errorf("attach shim: %w", err)
	}
	if err := failpoint.Hit("destroy/after-kill"); err != nil {
		return killErr, err
	}
	c.watches.forget(rt)
	return killErr, nil
}

// release removes what a stopped sandbox owned: host-port mappings, its
// network (and its slot's), cgroup and state dir, then the owner record.
// It keeps going past failed steps; the record stays if anything is left.
// st times the steps for the debug log (teardown's, with the stop in it).
//
// The network and the runtime state are independent and go side by side:
// deleting the veth and unmounting the netns pin wait for the kernel (RCU
// grace periods), removing the cgroup and the state dir mostly too, and
// with 50 kills in flight these waits added up within each kill. The
// mappings go in the same nftables transaction as the rest of the network
// (one commit per kill instead of one per port plus one).
func (c *Cubelet) release(ctx context.Context, rec nodestore.Sandbox, st *stepTimer) error {
	rt := rec.Runtime()
	var cleanupErr error
	cleaned := make(chan struct{})
	go func() {
		defer close(cleaned)
		if err := nsrt.Cleanup(ctx, c.sandboxDir(rt), c.cfg.CgroupParent, rt); err != nil {
			cleanupErr = fmt.Errorf("clean up runtime state: %w", err)
		}
		if isSlot(rt) {
			os.Remove(c.slotDisk(rt))
			os.Remove(c.slotFilePath(rt))
		}
	}()
	errs := c.releaseNetwork(ctx, rec)
	st.mark("network")
	if err := failpoint.Hit("destroy/after-detach"); err != nil {
		<-cleaned
		return err
	}
	<-cleaned
	st.mark("cleanup") // what the cleanup took beyond the network
	if cleanupErr != nil {
		errs = append(errs, cleanupErr)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := c.store.Delete(rec.ID); err != nil {
		return fmt.Errorf("delete owner record: %w", err)
	}
	st.mark("record")
	c.log.Info("sandbox removed", "sandbox", rec.ID)
	c.log.Debug("sandbox release steps", append([]any{"sandbox", rec.ID}, st.attrs()...)...)
	return nil
}

// releaseNetwork removes rec's host-port mappings and its network: egress
// chain and netns pin now, the veth pair with the netns (Release).
func (c *Cubelet) releaseNetwork(ctx context.Context, rec nodestore.Sandbox) []error {
	rt := rec.Runtime()
	ports := make([]uint16, 0, len(rec.Ports))
	for _, hp := range rec.Ports {
		ports = append(ports, hp)
	}
	var errs []error
	if err := c.dp.Release(ctx, rt, ports); err != nil {
		errs = append(errs, fmt.Errorf("detach network: %w", err))
	}
	// Every runtime object is named rt. A record the previous version wrote
	// while renaming a plain slot's endpoint to the sandbox id (RuntimeID =
	// slot id) may have it under either name: detach both (a no-op for the
	// name that has none).
	if rt != rec.ID {
		if err := c.dp.Detach(ctx, rec.ID); err != nil {
			errs = append(errs, fmt.Errorf("detach network under the sandbox id: %w", err))
		}
	}
	return errs
}

// KillAll tears down every sandbox on the node (clean shutdown of `cube up`
// without --keep-sandboxes).
func (c *Cubelet) KillAll(ctx context.Context) error {
	recs, _ := c.store.List()
	var errs []error
	for _, r := range recs {
		if r.State == nodestore.StatePooled {
			continue
		}
		if err := c.KillSandbox(ctx, r.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// DestroyNetwork removes the node's dataplane (cube-dp netns, host veth, nft
// tables). It refuses while any sandbox is recorded.
func (c *Cubelet) DestroyNetwork(ctx context.Context) error {
	if c.stopPool != nil {
		c.stopPool()
	}
	if err := c.DrainPool(ctx); err != nil {
		return err
	}
	recs, _ := c.store.List()
	if len(recs) > 0 {
		return fmt.Errorf("%d sandboxes still on the node: %w", len(recs), errdefs.ErrFailedPrecondition)
	}
	return errors.Join(c.dp.Destroy(ctx),
		cgroup.DeleteEverywhere(ctx, c.cfg.CgroupParent),
		cgroup.DeleteEverywhere(ctx, nsrt.ShimCgroup(c.cfg.CgroupParent)))
}

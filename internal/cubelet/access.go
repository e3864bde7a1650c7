package cubelet

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// SandboxAddr returns the address a local proxy dials to reach guest port
// `port` of a sandbox, mapping a host port for it on first use.
func (c *Cubelet) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	hp, err := c.HostPort(ctx, id, port)
	if err != nil {
		return "", err
	}
	return c.dp.DialAddr(hp), nil
}

// DataIP is the address at which the host ports of this node's sandboxes
// are dialled from the host netns (see DialContext).
func (c *Cubelet) DataIP() netip.Addr { return c.dp.DialHost() }

// HostPort returns the host port mapped to guest port `port` of a sandbox,
// mapping one on first use. The owner record is updated before the kernel.
func (c *Cubelet) HostPort(ctx context.Context, id string, port uint16) (uint16, error) {
	if port == 0 {
		return 0, fmt.Errorf("port 0: %w", errdefs.ErrInvalidArgument)
	}
	rec, err := c.store.Get(id)
	if err != nil {
		return 0, err
	}
	if hp, ok := rec.Ports[port]; ok {
		return hp, nil
	}
	unlock := c.lock(id)
	defer unlock()
	if rec, err = c.store.Get(id); err != nil {
		return 0, err
	}
	if rec.State != nodestore.StateRunning {
		return 0, fmt.Errorf("sandbox %s is %s: %w", id, rec.State, errdefs.ErrUnavailable)
	}
	if hp, ok := rec.Ports[port]; ok {
		return hp, nil
	}
	hp, err := c.takePort(ctx)
	if err == nil {
		rec.Ports[port] = hp
		err = c.putRecord(rec)
		c.addrs.ReleasePort(hp) // the record holds it now (or failed)
	}
	if err != nil {
		return 0, fmt.Errorf("map port %d: %w", port, err)
	}
	if err := c.dp.AddMapping(ctx, cubevs.Mapping{Owner: rec.Runtime(), HostPort: hp, SandboxIP: rec.IP, GuestPort: port}); err != nil {
		delete(rec.Ports, port)
		c.putRecord(rec)
		return 0, fmt.Errorf("map port %d: %w", port, err)
	}
	return hp, nil
}

// Sandboxes lists the sandboxes recorded as running on this node.
func (c *Cubelet) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	recs, _ := c.store.List()
	out := make([]Sandbox, 0, len(recs))
	for _, r := range recs {
		if r.State == nodestore.StateRunning {
			out = append(out, toSandbox(r))
		}
	}
	return out, nil
}

// SandboxMetrics reads the sandbox's cgroup counters. CPU usage is averaged
// over a short window.
func (c *Cubelet) SandboxMetrics(ctx context.Context, id string) (Metrics, error) {
	rec, err := c.store.Get(id)
	if err != nil {
		return Metrics{}, err
	}
	cg, err := cgroup.Open(c.cfg.CgroupParent, rec.Runtime())
	if err != nil {
		return Metrics{}, err
	}
	s1, err := cg.Stats()
	if err != nil {
		return Metrics{}, fmt.Errorf("read cgroup stats: %w", err)
	}
	const window = 100 * time.Millisecond
	t1 := time.Now()
	select {
	case <-ctx.Done():
		return Metrics{}, ctx.Err()
	case <-time.After(window):
	}
	s2, err := cg.Stats()
	if err != nil {
		return Metrics{}, fmt.Errorf("read cgroup stats: %w", err)
	}
	elapsed := time.Since(t1)
	pct := float64(s2.CPUUsageNs-s1.CPUUsageNs) / float64(elapsed.Nanoseconds()) / float64(max(rec.CPUCount, 1)) * 100
	used, total := c.diskUsage(ctx, rec)
	return Metrics{
		Timestamp: time.Now().UTC(), CPUCount: rec.CPUCount, CPUUsedPct: pct,
		MemUsed: s2.MemUsage, MemTotal: int64(rec.MemoryMB) << 20, MemCache: s2.MemCache,
		DiskUsed: used, DiskTotal: total,
	}, nil
}

// PauseSandbox freezes every process of the sandbox.
func (c *Cubelet) PauseSandbox(ctx context.Context, id string) error {
	return c.setPaused(ctx, id, true)
}

// ResumeSandbox thaws a paused sandbox.
func (c *Cubelet) ResumeSandbox(ctx context.Context, id string) error {
	return c.setPaused(ctx, id, false)
}

func (c *Cubelet) setPaused(ctx context.Context, id string, paused bool) error {
	unlock := c.lock(id)
	defer unlock()
	rec, err := c.store.Get(id)
	if err != nil {
		return err
	}
	sb, err := nsrt.Attach(ctx, c.sandboxDir(rec.Runtime()))
	if err != nil {
		return err
	}
	if paused {
		err = sb.Freeze(ctx)
	} else {
		err = sb.Thaw(ctx)
	}
	if err != nil {
		return err
	}
	rec.Paused = paused
	if err := c.putRecord(rec); err != nil {
		return err
	}
	c.logPaused(id, paused)
	return nil
}

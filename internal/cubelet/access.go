package cubelet

import (
	"context"
	"fmt"
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
	if port == 0 {
		return "", fmt.Errorf("port 0: %w", errdefs.ErrInvalidArgument)
	}
	rec, err := c.store.Get(id)
	if err != nil {
		return "", err
	}
	if hp, ok := rec.Ports[port]; ok {
		return c.dp.DialAddr(hp), nil
	}
	unlock := c.lock(id)
	defer unlock()
	if rec, err = c.store.Get(id); err != nil {
		return "", err
	}
	if rec.State != nodestore.StateRunning {
		return "", fmt.Errorf("sandbox %s is %s: %w", id, rec.State, errdefs.ErrUnavailable)
	}
	if hp, ok := rec.Ports[port]; ok {
		return c.dp.DialAddr(hp), nil
	}
	c.mu.Lock()
	_, takenPorts, err := c.taken(ctx)
	var hp uint16
	if err == nil {
		hp, err = cubevs.NextFreePort(c.cfg.Network.PortMin, c.cfg.Network.PortMax, takenPorts, 0)
	}
	if err == nil {
		// Record first, then program the kernel.
		rec.Ports[port] = hp
		err = c.putRecord(rec)
	}
	c.mu.Unlock()
	if err != nil {
		return "", fmt.Errorf("map port %d: %w", port, err)
	}
	if err := c.dp.AddMapping(ctx, cubevs.Mapping{Owner: id, HostPort: hp, SandboxIP: rec.IP, GuestPort: port}); err != nil {
		delete(rec.Ports, port)
		c.putRecord(rec)
		return "", fmt.Errorf("map port %d: %w", port, err)
	}
	return c.dp.DialAddr(hp), nil
}

// SandboxMetrics reads the sandbox's cgroup counters. CPU usage is averaged
// over a short window.
func (c *Cubelet) SandboxMetrics(ctx context.Context, id string) (Metrics, error) {
	rec, err := c.store.Get(id)
	if err != nil {
		return Metrics{}, err
	}
	cg, err := cgroup.Open(c.cfg.CgroupParent, id)
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
	used, total := diskUsage(c.sandboxDir(id), rec.DiskSizeMB)
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
	sb, err := nsrt.Attach(ctx, c.sandboxDir(id))
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
	return c.putRecord(rec)
}

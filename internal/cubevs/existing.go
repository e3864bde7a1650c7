package cubevs

import (
	"context"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cube-dev/cube/internal/errdefs"
)

// OpenExisting opens the dataplane described by cfg without creating or
// changing anything: no pin, link, sysctl or table is made or rewritten.
// It is what inspection tools use; mappings and endpoints can be read and
// removed through the handle. A missing dataplane pin yields an error
// wrapping errdefs.ErrNotFound.
func OpenExisting(ctx context.Context, cfg Config) (_ *Dataplane, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ok, err := isPinned(cfg.dpPin())
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("no dataplane pinned at %s (check --run-dir and --dp-name): %w", cfg.dpPin(), errdefs.ErrNotFound)
	}
	d := &Dataplane{cfg: cfg, mtu: cfg.MTU, hostNS: netns.None(), dpNS: netns.None()}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if cfg.HostNetNSPath != "" {
		d.hostNS, err = netns.GetFromPath(cfg.HostNetNSPath)
	} else {
		d.hostNS, err = netns.Get()
	}
	if err != nil {
		return nil, fmt.Errorf("open host netns: %w", err)
	}
	if d.host, err = netlink.NewHandleAt(d.hostNS); err != nil {
		return nil, fmt.Errorf("host netlink: %w", err)
	}
	if d.dpNS, err = netns.GetFromPath(cfg.dpPin()); err != nil {
		return nil, fmt.Errorf("open dataplane netns %s: %w", cfg.dpPin(), err)
	}
	if d.dp, err = netlink.NewHandleAt(d.dpNS); err != nil {
		return nil, fmt.Errorf("dataplane netlink: %w", err)
	}
	return d, nil
}

// DataplanePin returns the path at which the dataplane netns is pinned.
func (c Config) DataplanePin() string { return c.dpPin() }

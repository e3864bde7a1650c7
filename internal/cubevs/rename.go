package cubevs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Rename hands an attached endpoint from one owner to another: the netns pin
// moves to RunDir/netns/<to> (bind mount, then the old pin is removed) and
// the dataplane link is renamed LinkName(to) with alias to; its route to ip
// is restored. The warm pool uses it to give a pre-provisioned slot to a
// sandbox, so every kernel object carries the sandbox's id afterwards. The
// old owner must have no mappings or egress chain.
func (d *Dataplane) Rename(ctx context.Context, from, to string, ip netip.Addr) (Endpoint, error) {
	for _, o := range []string{from, to} {
		if err := d.cfg.validOwner(o); err != nil {
			return Endpoint{}, err
		}
	}
	unlock, err := d.lock(ctx)
	if err != nil {
		return Endpoint{}, err
	}
	defer unlock()
	fromPin, toPin := d.cfg.sandboxPin(from), d.cfg.sandboxPin(to)
	if ok, err := isPinned(fromPin); err != nil || !ok {
		return Endpoint{}, fmt.Errorf("rename %s: netns not pinned: %w", from, errors.Join(err, errdefs.ErrNotFound))
	}
	if ok, _ := isPinned(toPin); ok {
		return Endpoint{}, fmt.Errorf("rename %s to %s: %s already has a netns: %w", from, to, to, errdefs.ErrAlreadyExists)
	}
	link, err := d.dp.LinkByName(LinkName(from))
	if err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: link %s: %w", from, LinkName(from), errors.Join(err, errdefs.ErrNotFound))
	}
	f, err := os.OpenFile(toPin, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: create pin: %w", from, err)
	}
	f.Close()
	if err := unix.Mount(fromPin, toPin, "", unix.MS_BIND, ""); err != nil {
		os.Remove(toPin)
		return Endpoint{}, fmt.Errorf("rename %s: bind pin: %w", from, err)
	}
	if err := unpinNetNS(fromPin); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Endpoint{}, err
	}
	// A link must be down to be renamed; going down drops its route.
	if err := d.dp.LinkSetDown(link); err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: set down: %w", from, err)
	}
	if err := d.dp.LinkSetName(link, LinkName(to)); err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: link name: %w", from, err)
	}
	if err := d.dp.LinkSetAlias(link, to); err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: link alias: %w", from, err)
	}
	link, err = d.dp.LinkByName(LinkName(to))
	if err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: %w", from, err)
	}
	if err := d.configureDPSide(link, ip); err != nil {
		return Endpoint{}, fmt.Errorf("rename %s: %w", from, err)
	}
	return Endpoint{Owner: to, NetNSPath: toPin, IP: ip, LinkName: LinkName(to)}, nil
}

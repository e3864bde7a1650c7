package cubevs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DialContext connects to a DialAddr address from the host network
// namespace, where HostVeth and the route to the transit subnet live. When
// the caller runs in another network namespace (cubelet in a Pod on the Pod
// network, with HostNetNSPath = /proc/1/ns/net) the transit address is not
// routable from there, so the socket is created on an OS thread switched
// into the host namespace; a socket keeps the namespace it was created in.
// Otherwise it is a plain dial. It is safe for concurrent use and does not
// depend on the Dataplane handle being open.
func (d *Dataplane) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return dialIn(ctx, d.cfg.HostNetNSPath, network, address)
}

// dialTimeout bounds a connect to a sandbox's mapped port.
const dialTimeout = 5 * time.Second

func dialIn(ctx context.Context, nsPath, network, address string) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	if nsPath == "" {
		return dialer.DialContext(ctx, network, address)
	}
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("dial %s: open host netns %s: %w", address, nsPath, err)
	}
	defer target.Close()
	if same, err := sameAsProcessNetNS(target); err == nil && same {
		return dialer.DialContext(ctx, network, address)
	}
	type result struct {
		c   net.Conn
		err error
	}
	resc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			resc <- result{nil, fmt.Errorf("dial %s: current netns: %w", address, err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			resc <- result{nil, fmt.Errorf("dial %s: enter host netns: %w", address, err)}
			return
		}
		c, derr := dialer.DialContext(ctx, network, address)
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime discards it with this goroutine.
			if c != nil {
				c.Close()
			}
			resc <- result{nil, errors.Join(derr, fmt.Errorf("dial %s: restore thread netns: %w", address, err))}
			return
		}
		runtime.UnlockOSThread()
		resc <- result{c, derr}
	}()
	r := <-resc
	return r.c, r.err
}

// sameAsProcessNetNS reports whether ns is the network namespace of this
// process (its main thread), so no namespace switch is needed.
func sameAsProcessNetNS(ns netns.NsHandle) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(ns), &a); err != nil {
		return false, err
	}
	if err := unix.Stat("/proc/self/ns/net", &b); err != nil {
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestPodNetworkRecreate is the seeds' Pod recreate with hostNetwork false:
// cube up runs in its own network namespace (a Pod on the Pod network, only
// loopback) with the dataplane attached to the host netns. The process is
// SIGKILLed and its namespace deleted; a new cube up in a new namespace
// must serve every sandbox and create new ones at once.
func TestPodNetworkRecreate(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	n.hostNetNS = bins.hostNS
	n.podNS = newPodNS(t, filepath.Join(n.dir, "pod-a"))
	n.start()
	if err := inNS(bins.hostNS, func() error { _, err := netlink.LinkByName(n.net.HostVeth); return err }); err != nil {
		t.Fatalf("host veth %s is not in the host netns: %v", n.net.HostVeth, err)
	}
	sbs := n.createWithTickers(ctx, 3)
	n.assertServing(ctx, sbs) // the proxy reaches sandboxes from inside the Pod netns

	n.kill()
	if err := unpinNS(n.podNS); err != nil {
		t.Fatal(err)
	}
	n.podNS = newPodNS(t, filepath.Join(n.dir, "pod-b"))
	took := n.start()
	t.Logf("restart in a new Pod netns to serving: %s", took)
	n.assertServing(ctx, sbs)
	n.assertMappings(sbs)
	start := time.Now()
	sb, err := n.create(ctx)
	if err != nil {
		t.Fatalf("create in the new Pod: %v", err)
	}
	if out, err := n.run(ctx, sb, "echo ok"); err != nil || out != "ok\n" {
		t.Fatalf("new sandbox: %q %v", out, err)
	}
	t.Logf("first create + command in the new Pod: %s", time.Since(start))
}

// newPodNS makes a network namespace with only loopback up, pinned at path.
func newPodNS(t *testing.T, path string) string {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if err == nil {
			var lo netlink.Link
			if lo, err = netlink.LinkByName("lo"); err == nil {
				err = netlink.LinkSetUp(lo)
			}
		}
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, serr) // the thread stays locked and is discarded
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		unpinNS(path)
		t.Fatalf("pod netns: %v", err)
	}
	return path
}

// unpinNS deletes a pinned netns (processes inside keep it alive).
func unpinNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

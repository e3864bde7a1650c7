package cubelet

import (
	"context"
	"fmt"

	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/seccomp"
	"github.com/cube-dev/cube/internal/template"
)

// seccompSpec is the filter of a new sandbox of a template with defaults:
// the policy, plus the template's Syscalls, in log mode with SeccompLog
// (see watchSeccomp). It is compiled here, once per distinct choice per
// process, and handed down in the spec: sandbox-init installs it as is.
func (c *Cubelet) seccompSpec(defaults *template.Defaults) (*nsrt.Seccomp, error) {
	var allow []string
	if defaults != nil {
		allow = defaults.Syscalls
	}
	sc, err := nsrt.CompiledSeccomp(c.cfg.SeccompLog, allow)
	if err != nil {
		return nil, fmt.Errorf("syscall filter: %w", err)
	}
	return sc, nil
}

// watchSeccomp logs, with the sandbox's id, each syscall the kernel
// reports refused by a sandbox filter installed in log mode, until ctx
// ends. The kernel's record names a host pid; the pid's cgroup names the
// sandbox; for a process reaped before its record is read, the record's
// host uid does when the sandbox runs in a user namespace (each has its
// own id range). Otherwise it is logged at debug level with what the
// record says.
func (c *Cubelet) watchSeccomp(ctx context.Context) {
	c.log.Info("seccomp log mode: refused syscalls of sandboxes are logged", "source", seccomp.KmsgPath)
	err := seccomp.Watch(ctx, func(e seccomp.Event) {
		attrs := []any{"syscall", e.Syscall, "nr", e.Nr, "arch", fmt.Sprintf("%#x", e.Arch), "pid", e.PID, "comm", e.Comm, "exe", e.Exe}
		id := ""
		if name, err := nsrt.SandboxOfPID(e.PID, c.cfg.CgroupParent); err == nil {
			id = c.sandboxOfRuntime(name)
		} else if id = c.sandboxOfUID(e.UID); id == "" {
			c.log.Debug("seccomp refused a syscall outside any known sandbox", append(attrs, "err", err)...)
			return
		}
		c.log.Warn("seccomp refused a syscall", append([]any{"sandbox", id}, attrs...)...)
	})
	if err != nil {
		c.log.Error("seccomp log stopped", "err", err)
	}
}

// sandboxOfRuntime maps a runtime name (state dir, cgroup) to the id of
// the sandbox using it; a pool slot taken by a sandbox keeps its own name.
func (c *Cubelet) sandboxOfRuntime(name string) string {
	if rec, err := c.store.Get(name); err == nil && rec.Runtime() == name {
		return rec.ID
	}
	recs, _ := c.store.List()
	for _, rec := range recs {
		if rec.Runtime() == name {
			return rec.ID
		}
	}
	return name // a pre-started pool slot: no sandbox yet
}

// sandboxOfUID returns the sandbox whose user namespace maps host uid
// ("" for none): ranges are per IP slot (see runtimeSpec), and no host
// process outside a sandbox uses ids from nsrt.UserNSBase up.
func (c *Cubelet) sandboxOfUID(uid int) string {
	if uid < nsrt.UserNSBase {
		return ""
	}
	recs, _ := c.store.List()
	for _, rec := range recs {
		u := nsrt.UserNSForSlot(userNSSlot(c.cfg.Network.NodeCIDR, rec.IP))
		if uint64(uid) >= uint64(u.HostID) && uint64(uid) < uint64(u.HostID)+uint64(u.Size) {
			return rec.ID
		}
	}
	return ""
}

package cubelet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/failpoint"
	"github.com/cube-dev/cube/internal/template"
)

// Taking a ready pool slot: the create pipeline (pipeline.go) resumes after
// the slot's stage, and for a pre-started slot the personalise step below
// makes the running sandbox the requested one.

// takeUsableSlot takes a ready slot for a sandbox of tmpl, if any, setting
// aside pre-started slots whose sandbox died while they waited, and
// started slots whose ready command no longer passes (poolstart.go).
// arrived is when the create arrived: the adaptive pool counts a burst by
// arrivals, not by when the create-parallelism gate let each one through.
func (c *Cubelet) takeUsableSlot(ctx context.Context, tmpl template.Template, arrived time.Time) (poolSlot, bool) {
	c.pool.demand.record(tmpl.Name, arrived)
	for {
		s, ok := c.takeSlot(tmpl)
		if !ok || !s.prestarted() {
			return s, ok
		}
		if !s.alive() {
			c.discardSlot(s, "warm pool: pre-started slot's sandbox is gone; dropping the slot")
			continue
		}
		if err := c.slotStillReady(ctx, s, tmpl); err != nil {
			if ctx.Err() != nil { // the caller left: the slot is not to blame
				c.returnSlot(s)
				return poolSlot{}, false
			}
			c.discardSlot(s, "warm pool: started slot's ready command fails; dropping the slot", "err", err)
			continue
		}
		return s, true
	}
}

// personaliseParts are the parts of the personalise step, each a failpoint
// "create/personalise/after-<part>" (hostname and files run while envd is
// told its token, so they are not steps of their own).
var personaliseParts = []string{"hostname", "files", "envd", "limits"}

// personalise makes a sandbox launched ahead of time for a pre-started slot
// the requested one: hostname, the files that name it (/etc/hostname,
// /etc/hosts), envd's access token and env vars, and the cgroup limits when
// they differ from the slot's. b.token ends as the token envd accepts.
//
// envd is told nothing when the caller lets the node choose the token and
// asks for no env vars: it keeps the slot's token (random, never shown to
// anyone before) and has no env vars to take. That spares a round trip
// into the sandbox, and envd's work, on most creates. envd is known to
// run: the slot's envd answered when the slot was made, and checkInit
// finds the slot's pid 1, which exits when envd does.
func (b *build) personalise(ctx context.Context) error {
	if err := b.personaliseSlot(ctx); err != nil {
		return fmt.Errorf("personalise pre-started sandbox: %w", err)
	}
	return nil
}

func (b *build) personaliseSlot(ctx context.Context) error {
	ps, rec, netnsPath := b.from, b.rec, b.netnsPath()
	if err := checkInit(ps.initPID, netnsPath); err != nil {
		return err
	}
	fp := b.kind + "/personalise/after-"
	// The hostname and the files that name the sandbox (one discarded
	// thread: it joins the sandbox's UTS namespace and takes its root's
	// filesystem ids) are set while envd takes its token and env vars.
	rootDone := startOnDiscardedThread(func() error {
		if err := setHostnameLocked(ps.initPID, rec.ID); err != nil {
			return err
		}
		if err := failpoint.Hit(fp + "hostname"); err != nil {
			return err
		}
		files := map[string][]byte{"/etc/hostname": hostnameFile(rec), "/etc/hosts": hostsFile(rec)}
		if err := writeInRootLocked(ps.initPID, files); err != nil {
			return err
		}
		return failpoint.Hit(fp + "files")
	})
	var err error
	if b.mayKeepSlotToken && len(b.envVars) == 0 {
		b.token = ps.token
	} else {
		token := b.token
		err = initEnvd(ctx, netnsPath, ps.token, envdInit{AccessToken: &token, EnvVars: b.envVars})
	}
	if err == nil {
		err = failpoint.Hit(fp + "envd")
	}
	if err := errors.Join(<-rootDone, err); err != nil {
		return err
	}
	if rec.CPUCount != ps.rec.CPUCount || rec.MemoryMB != ps.rec.MemoryMB {
		cg, err := cgroup.Open(b.c.cfg.CgroupParent, rec.Runtime())
		if err != nil {
			return err
		}
		if err := cg.SetResources(sandboxResources(rec)); err != nil {
			return fmt.Errorf("set cgroup limits: %w", err)
		}
	}
	return failpoint.Hit(fp + "limits")
}

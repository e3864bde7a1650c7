package cubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/failpoint"
	"github.com/cube-dev/cube/internal/nodestore"
)

// createFromSlot turns a pre-started pool slot into the sandbox rec: the
// slot's record is replaced by the sandbox's (whose RuntimeID names the
// slot's state dir, cgroup, shim and network endpoint, which keep their
// names), egress set when it is not the slot's default, the running sandbox
// personalised (hostname,
// /etc/hostname and /etc/hosts, envd's token and env vars, cgroup limits),
// and only then is envd's host port mapped. Steps are SlotCreateSteps; a
// failure or crash after the record leaves a sandbox record whose teardown
// removes the whole slot.
func (c *Cubelet) createFromSlot(ctx context.Context, req CreateRequest, rec nodestore.Sandbox, ps poolSlot) (_ Sandbox, err error) {
	slot := ps.rec
	st := newStepTimer()
	ip, hostPort, release, err := c.allocate(ctx, slot)
	if err != nil {
		c.returnSlot(ps)
		return Sandbox{}, err
	}
	defer release()
	rec.IP = ip
	rec.Ports = map[uint16]uint16{EnvdPort: hostPort}
	rec.RuntimeID = slot.ID
	st.mark("allocate")
	if err := c.store.PutReplacing(rec, slot.ID); err != nil {
		c.returnSlot(ps)
		return Sandbox{}, fmt.Errorf("write owner record: %w", err)
	}
	defer func() {
		if err != nil {
			c.cleanUpFailedCreate(ctx, rec, nil)
		}
	}()
	if err := failpoint.Hit("create/after-record"); err != nil {
		return Sandbox{}, err
	}
	st.mark("record")
	// The endpoint and its egress chain keep the slot's name, like the
	// state dir, cgroup and shim: the record's RuntimeID owns them all.
	netnsPath := c.dp.Config().SandboxNetNSPath(slot.ID)
	os.Remove(c.slotFilePath(slot.ID))
	if err := failpoint.Hit("create/after-attach"); err != nil {
		return Sandbox{}, err
	}
	if p := egressOf(rec); !p.Equal(slotEgress) {
		if err := c.dp.SetEgress(ctx, slot.ID, ip, p); err != nil {
			return Sandbox{}, fmt.Errorf("egress policy: %w", err)
		}
	}
	if err := failpoint.Hit("create/after-egress"); err != nil {
		return Sandbox{}, err
	}
	st.mark("egress")
	token, err := c.personalise(ctx, req, rec, ps, netnsPath)
	if err != nil {
		return Sandbox{}, fmt.Errorf("personalise pre-started sandbox: %w", err)
	}
	st.mark("personalise")
	if err := c.dp.AddMapping(ctx, cubevs.Mapping{Owner: slot.ID, HostPort: hostPort, SandboxIP: ip, GuestPort: EnvdPort}); err != nil {
		return Sandbox{}, fmt.Errorf("map envd port: %w", err)
	}
	if err := failpoint.Hit("create/after-mapping"); err != nil {
		return Sandbox{}, err
	}
	st.mark("mapping")
	rec.State = nodestore.StateRunning
	if err := c.putRecord(rec); err != nil {
		return Sandbox{}, fmt.Errorf("record running sandbox: %w", err)
	}
	if err := failpoint.Hit("create/after-running"); err != nil {
		return Sandbox{}, err
	}
	st.mark("running")
	c.log.Info("sandbox created", "sandbox", rec.ID, "template", rec.Template, "ip", ip, "envdHostPort", hostPort, "slot", slot.ID)
	c.log.Debug("sandbox create steps", append([]any{"sandbox", rec.ID}, st.attrs()...)...)
	sb := toSandbox(rec)
	sb.EnvdAccessToken = token
	return sb, nil
}

// personalise makes the running slot sandbox rec's: hostname, the files
// that name it, envd's access token and env vars, and the cgroup limits
// when they differ from the slot's. It returns the token envd accepts.
//
// envd is told nothing when the caller lets the node choose the token and
// asks for no env vars: it keeps the slot's token (random, never shown to
// anyone before) and has no env vars to take. That spares a round trip
// into the sandbox, and envd's work, on most creates. envd is known to
// run: the slot's envd answered when the slot was made, and checkInit
// finds the slot's pid 1, which exits when envd does.
func (c *Cubelet) personalise(ctx context.Context, req CreateRequest, rec nodestore.Sandbox, ps poolSlot, netnsPath string) (string, error) {
	if err := checkInit(ps.initPID, netnsPath); err != nil {
		return "", err
	}
	// The hostname and the files that name the sandbox (one discarded
	// thread: it joins the sandbox's UTS namespace and takes its root's
	// filesystem ids) are set while envd takes its token and env vars.
	rootDone := startOnDiscardedThread(func() error {
		if err := setHostnameLocked(ps.initPID, rec.ID); err != nil {
			return err
		}
		if err := failpoint.Hit("create/after-hostname"); err != nil {
			return err
		}
		files := map[string][]byte{"/etc/hostname": hostnameFile(rec), "/etc/hosts": hostsFile(rec)}
		if err := writeInRootLocked(ps.initPID, files); err != nil {
			return err
		}
		return failpoint.Hit("create/after-files")
	})
	token := req.EnvdAccessToken
	var err error
	if req.NodeMayChooseToken && len(req.EnvVars) == 0 {
		token = ps.token
	} else {
		err = initEnvd(ctx, netnsPath, ps.token, envdInit{AccessToken: &token, EnvVars: req.EnvVars})
	}
	if err == nil {
		err = failpoint.Hit("create/after-envd-init")
	}
	if err := errors.Join(<-rootDone, err); err != nil {
		return "", err
	}
	if rec.CPUCount != ps.rec.CPUCount || rec.MemoryMB != ps.rec.MemoryMB {
		cg, err := cgroup.Open(c.cfg.CgroupParent, rec.Runtime())
		if err != nil {
			return "", err
		}
		if err := cg.SetResources(sandboxResources(rec)); err != nil {
			return "", fmt.Errorf("set cgroup limits: %w", err)
		}
	}
	return token, failpoint.Hit("create/after-limits")
}

// sandboxResources are the cgroup limits of a sandbox.
func sandboxResources(rec nodestore.Sandbox) cgroup.Resources {
	return cgroup.Resources{CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, PidsMax: sandboxPidsMax}
}

// sandboxPidsMax bounds the tasks of one sandbox.
const sandboxPidsMax = 4096

// stepTimer records how long each create step took, for debug logs.
type stepTimer struct {
	last  time.Time
	steps []any
}

func newStepTimer() *stepTimer { return &stepTimer{last: time.Now()} }

func (t *stepTimer) mark(step string) {
	now := time.Now()
	t.steps = append(t.steps, step, now.Sub(t.last).Round(10*time.Microsecond))
	t.last = now
}

func (t *stepTimer) attrs() []any { return t.steps }

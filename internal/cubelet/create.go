package cubelet

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/envd"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// envdReadyTimeout bounds how long a create waits for envd to listen.
const envdReadyTimeout = 30 * time.Second

// CreateSandbox creates and starts a sandbox, returning once envd inside it
// is listening: it runs the create pipeline (pipeline.go), from a ready
// pool slot when one fits, else from the start. On failure everything it
// made is removed again.
func (c *Cubelet) CreateSandbox(ctx context.Context, req CreateRequest) (_ Sandbox, err error) {
	start := time.Now()
	defer func() {
		if err != nil {
			c.metrics.createFailed()
		}
	}()
	if !validID(req.SandboxID) {
		return Sandbox{}, fmt.Errorf("sandbox id %q: %w", req.SandboxID, errdefs.ErrInvalidArgument)
	}
	defer c.pool.creating.start()()
	endTurn, err := c.takeTurn(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	defer endTurn()
	tmpl, err := c.template(ctx, req.Template)
	if err != nil {
		return Sandbox{}, fmt.Errorf("template %q: %w", req.Template, err)
	}
	unlock := c.lock(req.SandboxID)
	defer unlock()
	if _, err := c.store.Get(req.SandboxID); err == nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", req.SandboxID, errdefs.ErrAlreadyExists)
	}

	b := &build{c: c, kind: "create", tmpl: tmpl, token: req.EnvdAccessToken, envVars: req.EnvVars,
		mayKeepSlotToken: req.NodeMayChooseToken}
	b.rec = nodestore.Sandbox{
		ID: req.SandboxID, Template: tmpl.Name, State: nodestore.StateCreating,
		CPUCount: pick(req.CPUCount, tmpl.CPUCount), MemoryMB: pick(req.MemoryMB, tmpl.MemoryMB),
		DiskSizeMB: tmpl.DiskSizeMB, EnvdVersion: c.cfg.EnvdVersion,
		AllowInternet: req.AllowInternet, CreatedAt: time.Now().UTC(),
	}
	if req.WritableOnHost {
		// A build sandbox: no disk image, its upper dir stays on the
		// host's filesystem for CommitSandbox. Pool slots have a disk.
		b.rec.DiskSizeMB = 0
	}
	if b.rec.Generation, err = c.store.NextGeneration(); err != nil {
		return Sandbox{}, err
	}
	if !req.WritableOnHost {
		if s, ok := c.takeUsableSlot(ctx, tmpl, start); ok {
			b.from, b.reached = &s, s.stage
		}
		c.metrics.poolTake(tmpl.Name, b.from != nil)
	}
	defer b.done()
	if err := b.run(ctx, stepRunning); err != nil {
		return Sandbox{}, err
	}
	c.log.Info("sandbox created", "sandbox", b.rec.ID, "template", b.rec.Template, "ip", b.rec.IP,
		"envdHostPort", b.hostPort, "runtime", b.rec.Runtime())
	c.log.Debug("sandbox create steps", append([]any{"sandbox", b.rec.ID}, b.st.attrs()...)...)
	c.metrics.created(createPath(b.from), tmpl.Name, time.Since(start))
	c.logCreated(b.rec, createPath(b.from))
	sb := toSandbox(b.rec)
	sb.EnvdAccessToken = b.token
	return sb, nil
}

// runtimeSpec builds the namespace runtime's blueprint for one sandbox (or
// pre-started pool slot), named by rec.Runtime(); its hostname is rec.ID.
func (c *Cubelet) runtimeSpec(rec nodestore.Sandbox, token string, envVars map[string]string, defaults *template.Defaults, rootfs, netnsPath string) (nsrt.Spec, error) {
	envdCfg, err := json.Marshal(envdConfig(token, envVars, defaults))
	if err != nil {
		return nsrt.Spec{}, err
	}
	dir := c.sandboxDir(rec.Runtime())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nsrt.Spec{}, fmt.Errorf("sandbox state dir: %w", err)
	}
	userns, err := nsrt.ResolveUserNS(c.log, c.cfg.UserNS, userNSSlot(c.cfg.Network.NodeCIDR, rec.IP), rootfs, dir)
	if err != nil {
		return nsrt.Spec{}, err
	}
	args, reaper, binds := c.sandboxProcs(userns != nil)
	if args, binds, err = c.withInterp(rootfs, args, binds); err != nil {
		return nsrt.Spec{}, err
	}
	binds = c.withLogPipe(dir, binds)
	sc, err := c.seccompSpec(defaults)
	if err != nil {
		return nsrt.Spec{}, err
	}
	return nsrt.Spec{
		ID:        rec.Runtime(),
		StateDir:  dir,
		Rootfs:    rootfs,
		NetNSPath: netnsPath,
		Hostname:  rec.ID,
		Args:      args,
		Env:       sandboxEnv(args),
		Binds:     binds,
		Files: map[string]nsrt.FileSpec{
			"/etc/resolv.conf": {Data: c.dp.ResolvConf(), Mode: 0o644},
			"/etc/hosts":       {Data: hostsFile(rec), Mode: 0o644},
			"/etc/hostname":    {Data: hostnameFile(rec), Mode: 0o644},
			"/.cube/envd.json": {Data: envdCfg, Mode: 0o600},
		},
		Resources:    sandboxResources(rec),
		DiskSizeMB:   c.diskSizeMB(rec),
		CgroupParent: c.cfg.CgroupParent,
		ReadyTimeout: envdReadyTimeout,
		UserNS:       userns,
		Reaper:       reaper,
		Seccomp:      sc,
	}, nil
}

// sandboxResources are the cgroup limits of a sandbox.
func sandboxResources(rec nodestore.Sandbox) cgroup.Resources {
	return cgroup.Resources{CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, PidsMax: sandboxPidsMax}
}

// sandboxPidsMax bounds the tasks of one sandbox.
const sandboxPidsMax = 4096

// ReaperName is the file name of the pid-1 reaper looked for next to envd.
const ReaperName = "cube-reaper"

// sandboxProcs returns the argv of a sandbox's pid 1, the reaper that pid 1
// execs when the sandbox has a user namespace (the runtime then starts
// envd itself), and the binaries to bind in. With cube-reaper, pid 1 is
// that small binary; without, envd's own pid-1 mode reaps (it re-executes
// itself, or adopts the envd started in the user namespace).
func (c *Cubelet) sandboxProcs(userns bool) (args, reaper []string, binds []nsrt.Bind) {
	envd := []string{"/.cube/envd", "--ready-fd", "3", "--config", "/.cube/envd.json"}
	binds = []nsrt.Bind{{Source: c.cfg.EnvdPath, Target: "/.cube/envd", ReadOnly: true}}
	if c.cfg.ReaperPath == "" {
		return envd, []string{"/.cube/envd"}, binds
	}
	binds = append(binds, nsrt.Bind{Source: c.cfg.ReaperPath, Target: "/.cube/reaper", ReadOnly: true})
	if userns {
		return envd, []string{"/.cube/reaper"}, binds
	}
	return append([]string{"/.cube/reaper", "--inherit-fd", "3", "--"}, envd...), nil, binds
}

// userNSSlot is the sandbox's user namespace id range index: its IP's
// offset in the node CIDR, unique among the node's live sandboxes.
func userNSSlot(cidr netip.Prefix, ip netip.Addr) int {
	if !ip.Is4() || !cidr.Addr().Is4() {
		return 0
	}
	a, b := ip.As4(), cidr.Masked().Addr().As4()
	return int(binary.BigEndian.Uint32(a[:]) - binary.BigEndian.Uint32(b[:]))
}

// envdDefaultUser runs envd's commands when a request names no user.
const envdDefaultUser = "user"

func hostsFile(rec nodestore.Sandbox) []byte {
	return fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", rec.IP, rec.ID)
}

func hostnameFile(rec nodestore.Sandbox) []byte { return []byte(rec.ID + "\n") }

func toSandbox(r nodestore.Sandbox) Sandbox {
	return Sandbox{
		ID: r.ID, Template: r.Template, IP: r.IP, EnvdVersion: r.EnvdVersion,
		CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB, StartedAt: r.CreatedAt,
	}
}

// diskSizeMB is the writable layer's size limit (0 = unlimited).
func (c *Cubelet) diskSizeMB(rec nodestore.Sandbox) int {
	if c.cfg.NoDiskLimit {
		return 0
	}
	return rec.DiskSizeMB
}

func pick(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// validID accepts ids that are safe as DNS labels, file names and link aliases.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 63 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return id[0] != '-'
}

// sandboxEnv is the environment of the sandbox's workload (envd, behind the
// reaper when there is one), with envd.StartupProcsEnv: envd starts on one
// P, ~0.5 ms of CPU less per start, then takes both variables out of its
// environment and goes back to the default GOMAXPROCS. Not with the code
// interpreter in front: its server and kernels would inherit them.
func sandboxEnv(args []string) []string {
	env := []string{"PATH=" + nsrt.DefaultPath}
	if slices.Contains(args, sandboxInterpPath) {
		return env
	}
	return append(env, envd.StartupProcsEnv...)
}

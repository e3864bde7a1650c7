package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nsrt"
)

// waitPool waits until the pool has want ready slots.
func waitPool(t *testing.T, c *Cubelet, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.PoolSize() < want {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d slots, want %d", c.PoolSize(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readySlots returns a copy of the ready slots.
func readySlots(c *Cubelet) []poolSlot {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	return append([]poolSlot(nil), c.pool.ready...)
}

// hostnameOf reads the hostname of pid's UTS namespace on a discarded thread.
func hostnameOf(t *testing.T, pid int) string {
	t.Helper()
	type res struct {
		name string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: discarded with the goroutine
		fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWUTS); err != nil {
			ch <- res{err: err}
			return
		}
		var u unix.Utsname
		err = unix.Uname(&u)
		ch <- res{name: unix.ByteSliceToString(u.Nodename[:]), err: err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.name
}

// envdGet does GET path on a sandbox's envd through its host mapping.
func envdGet(t *testing.T, c *Cubelet, id, path, token string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr, err := c.SandboxAddr(ctx, id, EnvdPort)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf [4096]byte
	n, _ := resp.Body.Read(buf[:])
	return resp.StatusCode, buf[:n]
}

// TestPrestartedTake creates a sandbox from a pre-started slot and checks
// the personalisation: hostname, /etc/hostname and /etc/hosts (through
// planted template symlinks that point at host files, which must stay
// untouched), env vars, the access token (the slot's no longer works), the
// cgroup limits, and that nothing is left after a kill.
func TestPrestartedTake(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	slot := readySlots(c)[0]
	if !slot.prestarted() || slot.initPID <= 0 || !c.shimAlive(ctx, slot.rec.ID) {
		t.Fatalf("slot is not a running sandbox: %+v", slot)
	}
	// A slot's envd has no host port: nothing maps to it.
	if maps, _ := c.dp.Mappings(ctx); len(maps) != 0 {
		t.Fatalf("mappings with only a slot: %+v", maps)
	}
	// Template symlinks to host files, absolute and relative.
	hostDir := t.TempDir()
	hostHosts, hostName := filepath.Join(hostDir, "host-hosts"), filepath.Join(hostDir, "host-hostname")
	for _, f := range []string{hostHosts, hostName} {
		if err := os.WriteFile(f, []byte("host file\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := "/proc/" + strconv.Itoa(slot.initPID) + "/root"
	err := onDiscardedThread(func() error {
		return inRootLocked(slot.initPID, []string{"/etc"}, func(dirfd map[string]int) error {
			for name, target := range map[string]string{
				"hosts":    hostHosts,
				"hostname": strings.Repeat("../", 12) + strings.TrimPrefix(hostName, "/"),
			} {
				unix.Unlinkat(dirfd["/etc"], name, 0)
				if err := unix.Symlinkat(target, dirfd["/etc"], name); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}

	req := createReq("taken")
	req.EnvVars = map[string]string{"FROM_CREATE": "yes"}
	req.CPUCount, req.MemoryMB = 1, 256
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if sb.IP != slot.rec.IP || sb.CPUCount != 1 || sb.MemoryMB != 256 || sb.EnvdAccessToken != "tok" {
		t.Fatalf("sandbox %+v from slot %+v", sb, slot.rec)
	}
	rec, err := c.store.Get("taken")
	if err != nil || rec.RuntimeID != slot.rec.ID || rec.Runtime() != slot.rec.ID {
		t.Fatalf("record %+v, %v", rec, err)
	}
	if got := hostnameOf(t, slot.initPID); got != "taken" {
		t.Errorf("hostname %q", got)
	}
	for f, want := range map[string]string{"/etc/hostname": "taken\n", "/etc/hosts": "\ttaken\n"} {
		fi, err := os.Lstat(root + f)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Errorf("%s in the sandbox: %v %v", f, fi, err)
			continue
		}
		if b, _ := os.ReadFile(root + f); !strings.Contains(string(b), want) {
			t.Errorf("%s = %q, want it to contain %q", f, b, want)
		}
	}
	for _, f := range []string{hostHosts, hostName} {
		if b, _ := os.ReadFile(f); string(b) != "host file\n" {
			t.Errorf("host file %s was written through a template symlink: %q", f, b)
		}
	}
	if code, _ := envdGet(t, c, "taken", "/envs", ""); code != http.StatusUnauthorized {
		t.Errorf("envd without token after take: %d", code)
	}
	if code, _ := envdGet(t, c, "taken", "/envs", slot.token); code != http.StatusUnauthorized {
		t.Errorf("envd with the slot's token after take: %d", code)
	}
	code, body := envdGet(t, c, "taken", "/envs", "tok")
	var envs map[string]string
	if code != http.StatusOK || json.Unmarshal(body, &envs) != nil || envs["FROM_CREATE"] != "yes" {
		t.Errorf("envs with the sandbox token: %d %s", code, body)
	}
	cg, err := cgroup.Open(n.cfg.CgroupParent, slot.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cg.Version() == cgroup.V1 {
		b, _ := os.ReadFile(filepath.Join(cg.Dir("memory"), "memory.limit_in_bytes"))
		if strings.TrimSpace(string(b)) != strconv.Itoa(256<<20) {
			t.Errorf("memory limit %q", b)
		}
	}
	if m, err := c.SandboxMetrics(ctx, "taken"); err != nil || m.MemUsed <= 0 {
		t.Errorf("metrics %+v, %v", m, err)
	}
	if err := c.PauseSandbox(ctx, "taken"); err != nil {
		t.Fatal(err)
	}
	if err := c.ResumeSandbox(ctx, "taken"); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, 1)
	assertClean(t, c, "taken")
	if err := c.KillSandbox(ctx, "taken"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.sandboxDir(slot.rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("slot state dir left after kill: %v", err)
	}
	assertClean(t, c)
}

// TestPrestartedTakeKeepsSlotToken: a create that lets the node choose the
// token and asks for no env vars keeps the slot's envd untouched (no /init):
// the slot's token is the sandbox's, returned to the caller, and envd
// accepts it and nothing else. With env vars envd is told, and the
// request's token is the one in use.
func TestPrestartedTakeKeepsSlotToken(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		id      string
		envVars map[string]string
	}{
		{"slottoken", nil},
		{"withenv", map[string]string{"FROM_CREATE": "yes"}},
	} {
		waitPool(t, c, 1)
		slot := readySlots(c)[0]
		req := createReq(tc.id)
		req.NodeMayChooseToken, req.EnvVars = true, tc.envVars
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		want, rejected := slot.token, req.EnvdAccessToken
		if tc.envVars != nil {
			want, rejected = req.EnvdAccessToken, slot.token
		}
		if sb.EnvdAccessToken != want || len(slot.token) < 64 {
			t.Fatalf("%s: token %q, want %q", tc.id, sb.EnvdAccessToken, want)
		}
		if got := hostnameOf(t, slot.initPID); got != tc.id {
			t.Errorf("%s: hostname %q", tc.id, got)
		}
		for _, tok := range []string{"", rejected} {
			if code, _ := envdGet(t, c, tc.id, "/envs", tok); code != http.StatusUnauthorized {
				t.Errorf("%s: envd with token %q: %d, want 401", tc.id, tok, code)
			}
		}
		code, body := envdGet(t, c, tc.id, "/envs", want)
		var envs map[string]string
		if code != http.StatusOK || json.Unmarshal(body, &envs) != nil || envs["FROM_CREATE"] != tc.envVars["FROM_CREATE"] {
			t.Errorf("%s: envs with the sandbox's token: %d %s", tc.id, code, body)
		}
		if err := c.KillSandbox(ctx, tc.id); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, c)
}

// TestPrestartedRestart: pre-started slots and sandboxes made from them
// outlive a cubelet restart (slots are re-adopted and still usable, a slot
// whose sandbox died meanwhile is dropped), and a lost node store is rebuilt
// from the slot-named state dir.
func TestPrestartedRestart(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 2
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 2)
	if _, err := c.CreateSandbox(ctx, createReq("before")); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, 2)
	slots := readySlots(c)
	c.Close()

	// One slot's sandbox dies while the cubelet is down.
	sb, err := nsrt.Attach(ctx, c.sandboxDir(slots[0].rec.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sb.ShimPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sb.Close()
	time.Sleep(200 * time.Millisecond)

	// A pool of one: the re-adopted slot is the one the next create takes.
	n.cfg.PoolSize = 1
	c = n.start(t)
	got := readySlots(c)
	if len(got) != 1 || got[0].rec.ID != slots[1].rec.ID || got[0].token != slots[1].token || got[0].initPID != slots[1].initPID {
		t.Fatalf("slots after restart %+v, want only %+v", got, slots[1])
	}
	if err := envdHealthy(t, c, "before"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, createReq("after")); err != nil {
		t.Fatal(err)
	}
	if rec, _ := c.store.Get("after"); rec.RuntimeID != slots[1].rec.ID {
		t.Fatalf("create after restart did not use the re-adopted slot: %+v", rec)
	}
	if code, _ := envdGet(t, c, "after", "/envs", "tok"); code != http.StatusOK {
		t.Fatalf("re-adopted slot's envd: %d", code)
	}
	waitPool(t, c, 1)
	assertClean(t, c, "before", "after")
	c.Close()

	// Lost node store: the sandboxes come back from their slot-named state dirs.
	if err := os.Remove(filepath.Join(n.cfg.StateDir, "node.db")); err != nil {
		t.Fatal(err)
	}
	c = n.start(t)
	defer c.Close()
	for _, id := range []string{"before", "after"} {
		if err := envdHealthy(t, c, id); err != nil {
			t.Errorf("%s after store loss: %v", id, err)
		}
		if rec, err := c.store.Get(id); err != nil || !isSlot(rec.RuntimeID) {
			t.Errorf("%s rebuilt as %+v, %v", id, rec, err)
		}
	}
	waitPool(t, c, 1)
	assertClean(t, c, "before", "after")
	for _, id := range []string{"before", "after"} {
		if err := c.KillSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	assertClean(t, c)
}

// TestPrestartedInspect: a node with pre-started slots and a sandbox made
// from one has no findings, whether records come from the store or from
// the state dirs, and GC adopts the sandbox without orphans.
func TestPrestartedInspect(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	if _, err := c.CreateSandbox(ctx, createReq("seen")); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, 1)
	in, err := Inspect(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if in.Source != SourceStateDirs || in.Problems() != 0 || len(in.Live) != 2 {
		t.Fatalf("inspect (state dirs): %+v", in)
	}
	c.Close()
	in, err = Inspect(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if in.Source != SourceStore || in.Problems() != 0 || len(in.Live) != 2 {
		t.Fatalf("inspect (store): %+v", in)
	}
	rep, err := GC(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Orphans) != 0 || len(rep.Adopted) != 1 || rep.PoolSlots != 1 {
		t.Fatalf("gc report %+v", rep)
	}
	c = n.start(t)
	defer c.Close()
	if err := envdHealthy(t, c, "seen"); err != nil {
		t.Fatal(err)
	}
	assertClean(t, c, "seen")
}

// TestPrestartedDeadSlot: a ready slot whose supervisor died is not used:
// the create succeeds without it and the refill loop drops it.
func TestPrestartedDeadSlot(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	slot := readySlots(c)[0]
	sb, err := nsrt.Attach(ctx, c.sandboxDir(slot.rec.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sb.ShimPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sb.Close()
	for deadline := time.Now().Add(5 * time.Second); slot.alive(); {
		if time.Now().After(deadline) {
			t.Fatal("slot with a dead shim looks alive")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.CreateSandbox(ctx, createReq("survives")); err != nil {
		t.Fatal(err)
	}
	if rec, _ := c.store.Get("survives"); rec.RuntimeID == slot.rec.ID {
		t.Fatalf("create used the dead slot: %+v", rec)
	}
	if err := envdHealthy(t, c, "survives"); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := c.store.Get(slot.rec.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead slot %s still recorded", slot.rec.ID)
		}
	}
	assertClean(t, c, "survives")
}

// A create whose egress policy is not the slot's default re-applies it for
// the slot's address: the sandbox must not keep the slot's open policy.
func TestPrestartedTakeAppliesEgress(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	slot := readySlots(c)[0]
	internet := func() bool {
		t.Helper()
		out, err := exec.Command("nsenter", "--net="+filepath.Join(n.cfg.Network.RunDir, "netns", n.cfg.Network.DPName),
			"nft", "list", "set", "ip", n.cfg.Network.TablePrefix, "internet").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list set: %v\n%s", err, out)
		}
		return regexp.MustCompile(`[\s{,]` + regexp.QuoteMeta(slot.rec.IP.String()) + `[\s},]`).Match(out)
	}
	if !internet() {
		t.Fatalf("slot %s (%s) is not in the internet set: its default policy allows the internet", slot.rec.ID, slot.rec.IP)
	}
	req := createReq("closed")
	req.AllowInternet = false
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.store.Get(sb.ID)
	if err != nil || rec.Runtime() != slot.rec.ID {
		t.Fatalf("record %+v, %v: not made from slot %s", rec, err, slot.rec.ID)
	}
	if internet() {
		t.Fatalf("sandbox made with allow_internet=false from slot %s keeps the slot's internet access", slot.rec.ID)
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// The adaptive pool measures the slots it makes: a pre-started slot of
// the test template is counted at its real memory (a few MiB: envd and
// the init, plus the fixed overhead), not at poolSlotCostMB, so the budget
// pays for more of them.
func TestAdaptivePoolMeasuresSlots(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = PoolAdaptive
	n.cfg.PoolFloor = 2
	n.cfg.PoolMemoryMB = 10 * poolSlotCostMB
	c := n.start(t)
	defer c.Close()
	waitPool(t, c, 2)
	cost := c.pool.costs.of(mainTarget)
	if cost <= slotOverheadMB || cost >= poolSlotCostMB {
		t.Fatalf("measured slot cost %d MiB: want more than the %d MiB overhead and less than the unmeasured %d",
			cost, slotOverheadMB, poolSlotCostMB)
	}
	if got, want := c.poolCapacity(), int(10*poolSlotCostMB/cost); got != want {
		t.Fatalf("capacity %d, want %d (the budget at %d MiB a slot)", got, want, cost)
	}
	t.Logf("pre-started slot measured at %d MiB", cost)
}

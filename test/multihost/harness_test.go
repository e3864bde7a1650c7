package multihost_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/rootfstest"
)

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var httpc = &http.Client{Timeout: 30 * time.Second}

// proc is a process the test started inside a host's netns. nsenter only
// switches the network namespace and execs (no fork), so the pid is cube's
// own; unlike `ip netns exec` it keeps the mount namespace and /sys, so
// netns pins and cgroup mounts are the machine's.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startIn(t *testing.T, nsPath, bin, log string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + nsPath, "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill(syscall.SIGKILL) })
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) kill(sig syscall.Signal) {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func (p *proc) tail() string {
	s := p.logText()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// cluster is the servers and cubelets of one suite run.
type cluster struct {
	t         *testing.T
	tp        *topo
	dir       string
	key       string
	bin       string // cube binary for servers
	downAfter time.Duration
	db        string // --db ("" = SQLite in the server's data dir)
	servers   []*serverProc
	url       string // the server the test talks to
	nodes     map[string]*nodeProc
}

type serverProc struct {
	name, ip, url string
	p             *proc
}

type nodeProc struct {
	id, ip, dir, cg string
	bin             string
	args            []string
	net             cubevs.Config
	p               *proc
	c               *cluster
}

func newCluster(t *testing.T, tp *topo) *cluster {
	dir, err := os.MkdirTemp("", "cube-mh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return &cluster{t: t, tp: tp, dir: dir, key: "cube_test_" + randHex(8), bin: cubeBinary(t, ""),
		downAfter: 3 * time.Second, nodes: map[string]*nodeProc{}}
}

// addServer starts `cube server` in its own netns at 10.77.N.octet:3000.
func (c *cluster) addServer(name string, octet int) *serverProc {
	ip := c.tp.addHost(name, octet)
	s := &serverProc{name: name, ip: ip, url: "http://" + ip + ":3000"}
	args := []string{"server", "--listen", ip + ":3000", "--data-dir", filepath.Join(c.dir, name),
		"--api-key", c.key, "--node-down-after", c.downAfter.String()}
	if c.db != "" {
		args = append(args, "--db", c.db)
	}
	s.p = startIn(c.t, c.tp.nsPath(name), c.bin, filepath.Join(c.dir, name+".log"), args...)
	c.servers = append(c.servers, s)
	if c.url == "" {
		c.url = s.url
	}
	c.waitFor("server "+name+" health", 30*time.Second, func() bool {
		res, err := httpc.Get(s.url + "/health")
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == 200
	})
	return s
}

func (c *cluster) serverURLs() string {
	var u []string
	for _, s := range c.servers {
		u = append(u, s.url)
	}
	return strings.Join(u, ",")
}

// addNode registers a busybox template "tiny" in the node's data dir and
// starts its cubelet (binary bin, "" = default) in its own netns with the
// default dataplane names. It does not wait for registration.
func (c *cluster) addNode(id string, octet int, bin string) *nodeProc {
	t := c.t
	if bin == "" {
		bin = c.bin
	}
	ip := c.tp.addHost(id, octet)
	n := &nodeProc{id: id, ip: ip, dir: filepath.Join(c.dir, id), cg: "cube-mh" + c.tp.tag + "-" + id, bin: bin, c: c}
	n.net = cubevs.DefaultConfig()
	n.net.RunDir = filepath.Join(n.dir, "run")
	n.net.HostNetNSPath = c.tp.nsPath(id) // for the purge from the test's netns
	out, err := exec.Command(c.bin, "template", "create", "tiny", "--from-dir", busyboxRootfs(t), "--data-dir", n.dir).CombinedOutput()
	if err != nil {
		t.Fatalf("template create: %v\n%s", err, out)
	}
	// The default template asks for 2 vCPUs and the default schedulable
	// capacity is 8 per core (16 here): raise it so 60 sandboxes fit.
	n.args = []string{"cubelet", "--server", c.serverURLs(), "--node-id", id,
		"--listen", ip + ":7070", "--advertise-ip", ip, "--data-dir", n.dir, "--run-dir", n.net.RunDir,
		"--cgroup-parent", n.cg, "--build-base=false", "--envd", filepath.Join(binDir, "envd"),
		"--cpu-capacity", "512"}
	t.Cleanup(n.purge)
	n.start()
	c.nodes[id] = n
	return n
}

func (n *nodeProc) start() {
	n.p = startIn(n.c.t, n.c.tp.nsPath(n.id), n.bin, filepath.Join(n.c.dir, n.id+".log"), n.args...)
}

// purge removes everything the node made: sandboxes (through their shims'
// state dirs), its dataplane (pins, links, nft tables in the node's netns)
// and its cgroups.
func (n *nodeProc) purge() {
	if n.p != nil {
		n.p.kill(syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sbDir := filepath.Join(n.dir, "node", "sandboxes")
	ents, _ := os.ReadDir(sbDir)
	for _, e := range ents {
		if err := nsrt.Cleanup(ctx, filepath.Join(sbDir, e.Name()), n.cg, e.Name()); err != nil {
			n.c.t.Logf("purge %s sandbox %s: %v", n.id, e.Name(), err)
		}
	}
	if _, err := os.Stat(n.net.DataplanePin()); err == nil {
		if dp, err := cubevs.Open(ctx, n.net); err == nil {
			if err := dp.Destroy(ctx); err != nil {
				n.c.t.Logf("purge %s dataplane: %v", n.id, err)
			}
		} else {
			n.c.t.Logf("purge %s dataplane: %v", n.id, err)
		}
	}
	cgroup.DeleteEverywhere(ctx, n.cg)
	cgroup.DeleteEverywhere(ctx, nsrt.ShimCgroup(n.cg))
}

// local lists the sandboxes the node itself holds (its state dirs): the
// ground truth for where a sandbox runs.
func (n *nodeProc) local() map[string]bool {
	ents, _ := os.ReadDir(filepath.Join(n.dir, "node", "sandboxes"))
	out := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() {
			out[e.Name()] = true
		}
	}
	return out
}

func (c *cluster) waitFor(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %s\n%s", d, what, c.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) logs() string {
	var b strings.Builder
	for _, s := range c.servers {
		fmt.Fprintf(&b, "---- server %s log (tail) ----\n%s\n", s.name, s.p.tail())
	}
	ids := make([]string, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "---- cubelet %s log (tail) ----\n%s\n", id, c.nodes[id].p.tail())
	}
	return b.String()
}

type nodeStatus struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Version   string `json:"version"`
	Sandboxes int    `json:"sandboxes"`
	Reason    string `json:"reason"`
	Drain     *struct {
		Phase     string `json:"phase"`
		Remaining int    `json:"remaining"`
	} `json:"drain"`
}

// nodeLs runs `cube node ls --json` against the current server.
func (c *cluster) nodeLs() map[string]nodeStatus {
	c.t.Helper()
	out, err := c.cube(30*time.Second, "node", "ls", "--json")
	if err != nil {
		c.t.Fatalf("cube node ls: %v\n%s", err, out)
	}
	var ns []nodeStatus
	if err := json.Unmarshal([]byte(out), &ns); err != nil {
		c.t.Fatalf("cube node ls --json: %v\n%s", err, out)
	}
	m := map[string]nodeStatus{}
	for _, n := range ns {
		m[n.ID] = n
	}
	return m
}

// nodeStatus reads one node over REST (cheaper than the CLI, for polling).
func (c *cluster) nodeStatus(id string) nodeStatus {
	var ns []nodeStatus
	if code, _ := c.call(http.MethodGet, "/nodes", nil, &ns); code != 200 {
		return nodeStatus{}
	}
	for _, n := range ns {
		if n.ID == id {
			return n
		}
	}
	return nodeStatus{}
}

func (c *cluster) waitState(id, state string, d time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	c.waitFor("node "+id+" "+state, d, func() bool { return c.nodeStatus(id).State == state })
	return time.Since(start)
}

// call sends an authenticated JSON request to the current server and
// returns the status code (0 when the server cannot be reached) and body.
func (c *cluster) call(method, path string, body, out any) (int, string) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.url+path, rd)
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := httpc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if out != nil && res.StatusCode < 300 {
		json.Unmarshal(data, out)
	}
	return res.StatusCode, string(data)
}

// create makes a sandbox of template tiny and returns its id.
func (c *cluster) create(timeout int) (string, error) {
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	code, body := c.call(http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "tiny", "timeout": timeout}, &sb)
	if code != http.StatusCreated {
		return "", fmt.Errorf("create: %d %s", code, body)
	}
	return sb.SandboxID, nil
}

func (c *cluster) mustCreate(timeout int) string {
	c.t.Helper()
	id, err := c.create(timeout)
	if err != nil {
		c.t.Fatalf("%v\n%s", err, c.logs())
	}
	return id
}

// createMany creates n sandboxes with a few concurrent clients.
func (c *cluster) createMany(n, workers int) []string {
	c.t.Helper()
	type result struct {
		id  string
		err error
	}
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	res := make(chan result, n)
	for range workers {
		go func() {
			for range jobs {
				id, err := c.create(900)
				res <- result{id, err}
			}
		}()
	}
	var ids []string
	var errs []string
	for range n {
		r := <-res
		if r.err != nil {
			errs = append(errs, r.err.Error())
			continue
		}
		ids = append(ids, r.id)
	}
	if len(errs) > 0 {
		c.t.Fatalf("%d of %d creates failed, first: %s\n%s", len(errs), n, errs[0], c.logs())
	}
	return ids
}

func (c *cluster) sandboxCode(id string) int {
	code, _ := c.call(http.MethodGet, "/sandboxes/"+id, nil, nil)
	return code
}

func (c *cluster) listIDs() map[string]bool {
	c.t.Helper()
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if code, body := c.call(http.MethodGet, "/v2/sandboxes", nil, &list); code != 200 {
		c.t.Fatalf("list sandboxes: %d %s", code, body)
	}
	out := map[string]bool{}
	for _, s := range list {
		out[s.SandboxID] = true
	}
	return out
}

// envdHealth asks the sandbox's envd for /health through the server proxy,
// which dials the node's address and host port across the bridge.
func (c *cluster) envdHealth(id string) int {
	req, _ := http.NewRequest(http.MethodGet, c.url+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	res, err := httpc.Do(req)
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// cube runs the CLI against the current server.
func (c *cluster) cube(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args = append(args, "--server", c.url, "--api-key", c.key)
	out, err := exec.CommandContext(ctx, c.bin, args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func busyboxRootfs(t *testing.T) string { return rootfstest.Busybox(t) }

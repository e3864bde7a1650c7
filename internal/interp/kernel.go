package interp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// kernelStartTimeout bounds a kernel's start: process, sockets, first reply.
const kernelStartTimeout = 60 * time.Second

// kernelOpts says how to run a kernel process.
type kernelOpts struct {
	Cwd        string
	Env        []string            // the process environment (the spec's env is added)
	Credential *syscall.Credential // nil: run as this process's user
	RunDir     string              // parent of the kernel's private directory (connection file)
	Log        *slog.Logger
}

// kernel is one running Jupyter kernel process and the ZeroMQ sockets to
// it. Messages on shell and iopub are routed to the waiter registered for
// their parent msg_id (one execution at a time per kernel, see Context).
type kernel struct {
	spec    KernelSpec
	signer  signer
	session string
	log     *slog.Logger
	cmd     *exec.Cmd
	dir     string

	cancel                context.CancelFunc // ends the sockets
	shell, control, iopub zmq4.Socket

	exited  chan struct{} // closed when the process has exited
	exitErr error         // the process's Wait result, set before exited closes
	stderr  *tailBuffer

	stopWhy atomic.Value // error: why stop ended the kernel

	mu      sync.Mutex
	waiters map[string]chan message
	idle    chan struct{} // the first iopub message arrived (subscription works)
}

// startKernel starts a kernel for spec and returns once it answered a
// kernel_info_request and its iopub messages arrive, or fails within
// kernelStartTimeout (or ctx).
func startKernel(ctx context.Context, spec KernelSpec, opts kernelOpts) (_ *kernel, err error) {
	ctx, cancelStart := context.WithTimeout(ctx, kernelStartTimeout)
	defer cancelStart()
	dir, err := os.MkdirTemp(opts.RunDir, "kernel-")
	if err != nil {
		return nil, fmt.Errorf("kernel dir: %w", err)
	}
	k := &kernel{spec: spec, session: newID(), log: opts.Log, dir: dir, exited: make(chan struct{}),
		stderr: &tailBuffer{max: 4096}, waiters: map[string]chan message{}, idle: make(chan struct{})}
	defer func() {
		if err != nil {
			k.kill()
		}
	}()
	conn, err := k.writeConnectionFile(opts.Credential)
	if err != nil {
		return nil, err
	}
	if err := k.startProcess(spec, opts); err != nil {
		return nil, err
	}
	sockCtx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() { // a kernel that dies while we dial ends the dialling
		select {
		case <-k.exited:
			cancel()
		case <-sockCtx.Done():
		}
	}()
	if err := k.dial(sockCtx, conn); err != nil {
		return nil, k.startError(err)
	}
	go k.route(k.shell)
	go k.route(k.iopub)
	if err := k.handshake(ctx); err != nil {
		return nil, k.startError(err)
	}
	return k, nil
}

// connection is the Jupyter connection file.
type connection struct {
	IP              string `json:"ip"`
	Transport       string `json:"transport"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

func (k *kernel) connectionFile() string { return filepath.Join(k.dir, "connection.json") }

// writeConnectionFile picks five free loopback ports and a fresh key and
// writes them where only the kernel's user can read them.
func (k *kernel) writeConnectionFile(cred *syscall.Credential) (connection, error) {
	ports, err := freePorts(5)
	if err != nil {
		return connection{}, err
	}
	var key [32]byte
	_, _ = rand.Read(key[:])
	c := connection{IP: "127.0.0.1", Transport: "tcp", ShellPort: ports[0], IOPubPort: ports[1], StdinPort: ports[2],
		ControlPort: ports[3], HBPort: ports[4], Key: hex.EncodeToString(key[:]), SignatureScheme: "hmac-sha256",
		KernelName: k.spec.Name}
	k.signer = signer{key: []byte(c.Key)}
	b, err := json.Marshal(c)
	if err != nil {
		return connection{}, err
	}
	if err := os.WriteFile(k.connectionFile(), b, 0o600); err != nil {
		return connection{}, fmt.Errorf("write connection file: %w", err)
	}
	if cred != nil { // the kernel reads the file and removes it at exit
		for _, p := range []string{k.dir, k.connectionFile()} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return connection{}, fmt.Errorf("chown kernel dir: %w", err)
			}
		}
	}
	return c, nil
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (the kernel binds them; a port taken in between fails its start).
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick kernel port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (k *kernel) startProcess(spec KernelSpec, opts kernelOpts) error {
	argv := make([]string, len(spec.Argv))
	for i, a := range spec.Argv {
		argv[i] = strings.ReplaceAll(a, "{connection_file}", k.connectionFile())
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = opts.Cwd
	cmd.Env = append([]string(nil), opts.Env...)
	for name, v := range spec.Env {
		cmd.Env = append(cmd.Env, name+"="+v)
	}
	cmd.Stdout, cmd.Stderr = k.stderr, k.stderr
	// Own process group: an interrupt reaches the kernel and what it runs,
	// and kill takes all of them. Pdeathsig: a kernel does not outlive a
	// crashed server (its supervisor starts a new one, which starts new
	// kernels; Go does not end the threads that start them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opts.Credential, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kernel %s: %w", spec.Name, err)
	}
	k.cmd = cmd
	go func() {
		k.exitErr = cmd.Wait()
		close(k.exited)
	}()
	return nil
}

func (k *kernel) dial(ctx context.Context, c connection) error {
	opts := []zmq4.Option{zmq4.WithDialerRetry(50 * time.Millisecond), zmq4.WithDialerMaxRetries(int(kernelStartTimeout / (50 * time.Millisecond)))}
	ep := func(port int) string { return fmt.Sprintf("tcp://%s:%d", c.IP, port) }
	k.shell = zmq4.NewDealer(ctx, opts...)
	k.control = zmq4.NewDealer(ctx, opts...)
	k.iopub = zmq4.NewSub(ctx, opts...)
	for _, s := range []struct {
		sock zmq4.Socket
		port int
	}{{k.shell, c.ShellPort}, {k.control, c.ControlPort}, {k.iopub, c.IOPubPort}} {
		if err := s.sock.Dial(ep(s.port)); err != nil {
			return fmt.Errorf("connect to kernel: %w", err)
		}
	}
	// Subscribe after dialling: zmq4 sends the subscription to the
	// connections that exist when it is set.
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fmt.Errorf("subscribe to kernel output: %w", err)
	}
	return nil
}

// handshake asks for kernel_info until the reply came and an iopub message
// arrived: a SUB socket misses what is published before its subscription
// took effect, so executions must not start earlier.
func (k *kernel) handshake(ctx context.Context) error {
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var replied atomic.Bool
	var ids []string
	n := 0
	defer func() {
		for _, id := range ids {
			k.unregister(id)
		}
	}()
	send := func() error {
		id := newID()
		ch := k.register(id)
		ids = append(ids, id)
		go func() {
			for m := range ch {
				if m.Header.MsgType == "kernel_info_reply" {
					replied.Store(true)
				}
			}
		}()
		return k.send(k.shell, "kernel_info_request", id, struct{}{})
	}
	if err := send(); err != nil {
		return err
	}
	for {
		select {
		case <-k.idle:
			if replied.Load() {
				return nil
			}
		default:
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kernel did not answer: %w", ctx.Err())
		case <-k.exited:
			return errors.New("kernel exited during start")
		case <-tick.C:
			if n++; n%8 == 0 { // ask again every 200ms until iopub delivers
				if err := send(); err != nil {
					return err
				}
			}
		}
	}
}

// startError adds the end of the kernel's output to err: why a kernel does
// not start is usually there (a missing module, a bad argv).
func (k *kernel) startError(err error) error {
	select {
	case <-k.exited:
		err = fmt.Errorf("%w (%v)", err, k.exitErr)
	default:
	}
	if tail := strings.TrimSpace(k.stderr.String()); tail != "" {
		return fmt.Errorf("%w; kernel output: %s", err, tail)
	}
	return err
}

func (k *kernel) send(sock zmq4.Socket, msgType, msgID string, content any) error {
	frames, err := k.signer.encode(k.session, msgType, msgID, content)
	if err != nil {
		return err
	}
	if err := sock.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		return fmt.Errorf("send %s to kernel: %w", msgType, err)
	}
	return nil
}

// register returns the channel that gets the messages whose parent is
// msgID until unregister.
func (k *kernel) register(msgID string) chan message {
	ch := make(chan message, 64)
	k.mu.Lock()
	k.waiters[msgID] = ch
	k.mu.Unlock()
	return ch
}

func (k *kernel) unregister(msgID string) {
	k.mu.Lock()
	ch, ok := k.waiters[msgID]
	delete(k.waiters, msgID)
	k.mu.Unlock()
	if ok {
		close(ch)
	}
}

// route reads sock until it is closed and hands every message to the
// waiter of its parent; messages nobody waits for are dropped.
func (k *kernel) route(sock zmq4.Socket) {
	first := sock == k.iopub
	for {
		raw, err := sock.Recv()
		if err != nil {
			return
		}
		m, err := k.signer.decode(raw.Frames)
		if err != nil {
			k.log.Warn("dropped kernel message", "err", err)
			continue
		}
		if first {
			first = false
			close(k.idle)
		}
		// Delivered under the lock so unregister cannot close the channel
		// in between; a waiter always drains its channel, so this blocks
		// at most until it reads.
		k.mu.Lock()
		if ch, ok := k.waiters[m.ParentHeader.MsgID]; ok {
			ch <- m
		}
		k.mu.Unlock()
	}
}

// interrupt asks the kernel to stop what it runs (KeyboardInterrupt in
// Python): by SIGINT to its process group, or by interrupt_request on the
// control channel for kernels that ask for it.
func (k *kernel) interrupt() error {
	if k.spec.InterruptMode == "message" {
		return k.send(k.control, "interrupt_request", newID(), struct{}{})
	}
	if err := syscall.Kill(-k.cmd.Process.Pid, syscall.SIGINT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("interrupt kernel: %w", err)
	}
	return nil
}

// alive reports whether the kernel process still runs.
func (k *kernel) alive() bool {
	select {
	case <-k.exited:
		return false
	default:
		return true
	}
}

// stop ends the kernel for reason (errStopRestarted, errStopRemoved): the
// execution running on it reports that reason.
func (k *kernel) stop(reason error) {
	k.stopWhy.Store(reason)
	k.kill()
}

// stopReason is why the kernel exited: the reason given to stop, else
// errKernelDied.
func (k *kernel) stopReason() error {
	if err, ok := k.stopWhy.Load().(error); ok {
		return err
	}
	return errKernelDied
}

// kill ends the kernel's process group and sockets and removes its
// directory; it returns once the process is gone.
func (k *kernel) kill() {
	if k.cmd != nil && k.cmd.Process != nil {
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
	}
	if k.cancel != nil {
		k.cancel()
	}
	for _, s := range []zmq4.Socket{k.shell, k.control, k.iopub} {
		if s != nil {
			_ = s.Close()
		}
	}
	_ = os.RemoveAll(k.dir)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

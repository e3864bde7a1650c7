package process

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/errdefs"
)

// DefaultPath is the PATH a process gets unless the sandbox or the request
// sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// spawnRequest is a validated StartRequest.
type spawnRequest struct {
	config   *pb.ProcessConfig
	tag      *string
	pty      *pb.PTY_Size // nil without PTY
	stdin    bool
	user     account.User
	lifetime time.Duration // 0 = unlimited
}

// environ builds the process environment: base variables, then the sandbox's
// variables, then the request's (later wins). The result is sorted.
func environ(u account.User, sandbox, request map[string]string) ([]string, map[string]string, error) {
	env := map[string]string{"PATH": DefaultPath, "HOME": u.Home, "USER": u.Name, "LOGNAME": u.Name}
	for _, vars := range []map[string]string{sandbox, request} {
		for k, v := range vars {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
				return nil, nil, fmt.Errorf("bad environment variable %q: %w", k, errdefs.ErrInvalidArgument)
			}
			env[k] = v
		}
	}
	list := make([]string, 0, len(env))
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return list, env, nil
}

// workdir picks and checks the working directory.
func workdir(cfg *pb.ProcessConfig, u account.User, defaultDir string) (string, error) {
	base := u.Home
	if defaultDir != "" {
		base = defaultDir
	}
	dir := base
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		if strings.HasPrefix(cfg.GetCwd(), "~") {
			base = u.Home
		}
		var err error
		if dir, err = account.ResolvePath(cfg.GetCwd(), base); err != nil {
			return "", fmt.Errorf("cwd: %w", err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("cwd %q does not exist: %w", dir, errdefs.ErrInvalidArgument)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("cwd %q is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return dir, nil
}

// lookPath resolves name like a shell would, using the child's PATH.
func lookPath(name, pathEnv, dir string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		if err := executable(name); err != nil {
			return "", fmt.Errorf("command %q: %w", name, err)
		}
		return name, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in PATH: %w", name, errdefs.ErrInvalidArgument)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("not found: %w", errdefs.ErrInvalidArgument)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("not an executable file: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// credential returns the credential to run as u, or nil when envd already
// runs as u. A non-root envd cannot switch users.
func credential(u account.User) (*syscall.Credential, error) {
	if os.Geteuid() == 0 {
		return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}, nil
	}
	if uint32(os.Geteuid()) == u.UID {
		return nil, nil
	}
	return nil, fmt.Errorf("envd is not root and cannot run as %q: %w", u.Name, errdefs.ErrPermissionDenied)
}

// spawn starts the process described by req. The returned proc is running
// and already has sub attached, so no output is lost; the caller must call
// proc.run.
func spawn(req spawnRequest, sandboxEnv map[string]string, defaultDir string) (p *proc, sub *subscriber, err error) {
	cfg := shellFallback(req.config) // the process reports what runs
	if cfg.GetCmd() == "" {
		return nil, nil, fmt.Errorf("process.cmd is required: %w", errdefs.ErrInvalidArgument)
	}
	for _, a := range cfg.GetArgs() {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, nil, fmt.Errorf("argument contains a NUL byte: %w", errdefs.ErrInvalidArgument)
		}
	}
	env, envMap, err := environ(req.user, sandboxEnv, cfg.GetEnvs())
	if err != nil {
		return nil, nil, err
	}
	dir, err := workdir(cfg, req.user, defaultDir)
	if err != nil {
		return nil, nil, err
	}
	path, err := lookPath(cfg.GetCmd(), envMap["PATH"], dir)
	if err != nil {
		return nil, nil, err
	}
	cred, err := credential(req.user)
	if err != nil {
		return nil, nil, err
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:         env,
		Dir:         dir,
		SysProcAttr: &syscall.SysProcAttr{Credential: cred},
	}
	p = &proc{
		config: cfg,
		tag:    req.tag,
		cmd:    cmd,
		out:    make(chan *pb.ProcessEvent),
		subs:   map[*subscriber]struct{}{},
		done:   make(chan struct{}),
	}
	var childFiles []*os.File // closed in the parent after start
	defer func() {
		for _, f := range childFiles {
			_ = f.Close()
		}
		if err != nil {
			for _, f := range append(p.outs, p.stdin) {
				if f != nil {
					_ = f.Close()
				}
			}
		}
	}()
	if req.pty != nil {
		ptmx, tty, perr := pty.Open()
		if perr != nil {
			return nil, nil, fmt.Errorf("open pty: %w", perr)
		}
		p.ptmx, p.outs = ptmx, []*os.File{ptmx}
		childFiles = append(childFiles, tty)
		if cred != nil {
			_ = tty.Chown(int(cred.Uid), int(cred.Gid))
		}
		if err := p.resize(req.pty); err != nil {
			return nil, nil, err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
	} else {
		cmd.SysProcAttr.Setpgid = true
		for range 2 {
			r, w, perr := os.Pipe()
			if perr != nil {
				return nil, nil, fmt.Errorf("create output pipe: %w", perr)
			}
			p.outs = append(p.outs, r)
			childFiles = append(childFiles, w)
		}
		cmd.Stdout, cmd.Stderr = childFiles[0], childFiles[1]
		if req.stdin {
			r, w, perr := os.Pipe()
			if perr != nil {
				return nil, nil, fmt.Errorf("create stdin pipe: %w", perr)
			}
			p.stdin = w
			childFiles = append(childFiles, r)
			cmd.Stdin = r
		}
	}
	sub, _ = p.subscribe(false)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %q: %w", cfg.GetCmd(), err)
	}
	p.pid = uint32(cmd.Process.Pid)
	if req.lifetime > 0 {
		p.timer = time.AfterFunc(req.lifetime, func() { _ = p.signal(syscall.SIGKILL) })
	}
	return p, sub, nil
}

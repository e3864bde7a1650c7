package templatebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// Step labels of log entries and failure reasons besides "1".."n".
const (
	stepBase     = "base"
	stepFinalize = "finalize"
)

// tailLines is how much of a failed command's output its failure reason
// quotes.
const tailLines = 20

// stepError is a build failure attributed to a step label.
type stepError struct {
	step string
	msg  string
}

func (e *stepError) Error() string { return e.msg }

func failf(step, format string, args ...any) error {
	return &stepError{step: step, msg: fmt.Sprintf(format, args...)}
}

// runner runs one build: the Service's (recorded in the store) or
// Execute's (a built-in recipe on a node, no store).
type runner struct {
	deps
	target  Target
	buildID string // "" for Execute's builds
	from    Parent
	parent  string // the template the build starts from (from.Template, or from.Image's)
	spec    BuildSpec
	st      state
	env     *envd
	sandbox string   // the build sandbox
	tail    []string // the current step's last output lines
}

// run runs a started build to its end and records the outcome. It owns
// the build: the status changes only here, or in another replica that
// found its heartbeats stopped (liveness.go).
func (s *Service) run(b store.TemplateBuild, from Parent, spec BuildSpec) {
	lctx, lost := context.WithCancelCause(s.ctx)
	defer lost(nil)
	ctx, cancel := context.WithTimeout(lctx, s.cfg.BuildTimeout)
	defer cancel()
	hctx, stopHeartbeat := context.WithCancel(ctx)
	defer stopHeartbeat()
	go s.heartbeat(hctx, b.ID, lost)
	start := time.Now()
	s.cfg.Metrics.buildStarted()
	r := &runner{deps: s.deps(b.ID), target: Target{Name: b.Template, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB},
		buildID: b.ID, from: from, parent: from.Template, spec: spec}
	blog := newBuildLog(s.cfg.Store, b.ID, s.log)
	r.log = blog
	err := r.waitSlot(ctx, s.slots)
	if err == nil {
		defer func() { <-s.slots }()
		err = r.build(ctx)
	}
	status, reason := store.BuildReady, ""
	if err != nil {
		var se *stepError
		if !errors.As(err, &se) {
			se = &stepError{step: stepBase, msg: err.Error()}
		}
		switch {
		case errors.Is(context.Cause(lctx), errLostBuild):
			se.msg = interruptedReason + " (" + errLostBuild.Error() + ")"
		case s.ctx.Err() != nil:
			se.msg = "interrupted: the server stopped during the build; start the build again"
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			se.msg = fmt.Sprintf("the build took longer than %s and was stopped", s.cfg.BuildTimeout)
		}
		r.log.add(levelError, se.step, "build failed: "+se.msg)
		status, reason = store.BuildError, reasonJSON(Reason{Message: se.msg, Step: se.step})
	} else {
		r.log.infof(stepFinalize, "build finished in %s", time.Since(start).Round(time.Millisecond))
	}
	blog.close()
	stopHeartbeat()
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer fcancel()
	if _, err := s.cfg.Store.FinishTemplateBuild(fctx, b.ID, status, reason); err != nil {
		s.log.Error("record the end of a template build", "build", b.ID, "err", err)
	}
	s.log.Info("template build finished", "build", b.ID, "template", b.Template, "status", status, "duration", time.Since(start))
	s.cfg.Metrics.buildFinished(err, lctx, time.Since(start))
}

func (r *runner) waitSlot(ctx context.Context, slots chan struct{}) error {
	select {
	case slots <- struct{}{}:
		return nil
	default:
	}
	r.log.infof(stepBase, "waiting for a free build slot (%d builds run at once)", cap(slots))
	select {
	case slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return failf(stepBase, "%v", ctx.Err())
	}
}

// build runs the steps in a build sandbox and commits the result. The
// sandbox is always killed at the end.
func (r *runner) build(ctx context.Context) (err error) {
	steps := r.spec.Steps
	n := len(steps)
	if r.from.Image != "" {
		if r.parent, err = r.importImage(ctx); err != nil {
			return err
		}
	}
	r.log.infof(stepBase, "building template %s from %s", r.target.Name, r.parent)
	parent, err := r.templates.Get(ctx, r.parent)
	if err != nil {
		return failf(stepBase, "template %s: %v", r.parent, err)
	}
	r.st = initialState(parent)
	keys := cacheKeys(parentKey(parent), steps)
	from, cached := r.parent, 0
	if !r.spec.Force {
		var st state
		if cached, st = r.findCached(ctx, keys, steps); cached > 0 {
			from, r.st = cacheName(keys[cached]), st
		}
	}
	for i := range cached {
		r.log.infof(strconv.Itoa(i+1), "[%d/%d] %s", i+1, n, steps[i].describe())
		r.log.infof(strconv.Itoa(i+1), "step %d: cached", i+1)
		r.metrics.stepDone(steps[i].Type, true, 0)
	}
	id, err := r.sandboxes.CreateBuildSandbox(ctx, from, r.target.CPUCount, r.target.MemoryMB)
	if err != nil {
		return failf(stepBase, "start the build sandbox from %s: %v", from, err)
	}
	defer func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if kerr := r.sandboxes.KillSandbox(kctx, id); kerr != nil && !errors.Is(kerr, errdefs.ErrNotFound) {
			r.warn.Warn("kill build sandbox", "build", r.buildID, "template", r.target.Name, "sandbox", id, "err", kerr)
		}
		if r.recordSandbox != nil {
			_ = r.recordSandbox(kctx, "")
		}
	}()
	r.sandbox = id
	if r.recordSandbox != nil {
		if err := r.recordSandbox(ctx, id); err != nil {
			return failf(stepBase, "record the build sandbox: %v", err)
		}
	}
	r.log.add(levelDebug, stepBase, "build sandbox "+id+" started from "+from)
	hc, base, token, err := r.sandboxes.Envd(ctx, id)
	if err != nil {
		return failf(stepBase, "reach envd in the build sandbox: %v", err)
	}
	r.env = newEnvd(hc, base, token)
	for i := cached; i < n; i++ {
		label := strconv.Itoa(i + 1)
		r.log.infof(label, "[%d/%d] %s", i+1, n, steps[i].describe())
		stepStart := time.Now()
		if err := r.step(ctx, label, steps[i]); err != nil {
			return err
		}
		r.metrics.stepDone(steps[i].Type, false, time.Since(stepStart))
		if steps[i].Type == StepEnv {
			continue // no filesystem change: the next commit carries the env
		}
		if r.noStepCache {
			continue
		}
		name := cacheName(keys[i+1])
		if _, err := r.templates.Get(ctx, name); err == nil {
			// Same key, same result (a forced rerun): keep the existing
			// one, which another build's sandbox may be running from.
			r.log.add(levelDebug, label, "already cached as "+name)
			continue
		}
		if err := r.commit(ctx, name, 0, 0, nodeproto.TemplateDefaults{Env: r.st.Env, Workdir: r.st.Workdir, User: r.st.User}); err != nil {
			return failf(label, "step %s: cache the result: %v", label, err)
		}
		r.log.add(levelDebug, label, "cached as "+name)
	}
	d := nodeproto.TemplateDefaults{Env: r.st.Env, Workdir: r.st.Workdir, User: r.st.User, StartCmd: r.spec.StartCmd, ReadyCmd: r.spec.ReadyCmd}
	if r.finalTarget != nil {
		name, err := r.finalTarget(ctx, r.parent)
		if err != nil {
			return failf(stepFinalize, "%v", err)
		}
		r.target.Name = name
	}
	r.log.infof(stepFinalize, "committing template %s", r.target.Name)
	if err := r.commit(ctx, r.target.Name, r.target.CPUCount, r.target.MemoryMB, d); err != nil {
		return failf(stepFinalize, "commit template %s: %v", r.target.Name, err)
	}
	if r.committed != nil {
		if err := r.committed(ctx, r.target.Name); err != nil {
			return failf(stepFinalize, "tag template %s: %v", r.target.Name, err)
		}
	}
	return nil
}

// findCached returns how many leading steps have a cached result (the
// deepest cache template that exists, never at or past a forced step) and
// the state recorded with it.
func (r *runner) findCached(ctx context.Context, keys []string, steps []Step) (int, state) {
	limit := len(steps)
	for i, st := range steps {
		if st.Force {
			limit = i
			break
		}
	}
	for i := limit; i > 0; i-- {
		t, err := r.templates.Get(ctx, cacheName(keys[i]))
		if err != nil {
			continue
		}
		return i, initialState(t)
	}
	return 0, state{}
}

func (r *runner) commit(ctx context.Context, name string, cpu, mem int, d nodeproto.TemplateDefaults) error {
	return r.sandboxes.CommitSandbox(ctx, nodeproto.CommitRequest{SandboxID: r.sandbox, Name: name, CPUCount: cpu, MemoryMB: mem, Defaults: d})
}

// step runs one step and updates the state.
func (r *runner) step(ctx context.Context, label string, st Step) error {
	a := st.Args
	switch st.Type {
	case StepRun:
		user := r.st.User
		if len(a) > 1 && a[1] != "" {
			user = a[1]
		}
		return r.shell(ctx, label, user, r.st.Workdir, a[0])
	case StepCopy:
		return r.copy(ctx, label, st)
	case StepEnv:
		var out bytes.Buffer
		code, err := r.env.runRaw(ctx, r.st.User, r.st.Workdir, r.st.Env, envScript(a), &out, r.line(label))
		if err != nil {
			return failf(label, "step %s: %v", label, err)
		}
		if code != 0 {
			return r.exitError(label, code)
		}
		vals := strings.Split(out.String(), "\x00")
		if len(vals) < len(a)/2 {
			return failf(label, "step %s: expanding the values printed %d of %d", label, len(vals), len(a)/2)
		}
		for i := 0; i < len(a); i += 2 {
			r.st.Env[a[i]] = vals[i/2]
		}
		return nil
	case StepWorkdir:
		dir := r.st.resolve(a[0])
		if err := r.shell(ctx, label, r.st.User, "/", workdirScript(dir)); err != nil {
			return err
		}
		r.st.Workdir = strings.TrimSuffix(dir, "/")
		if r.st.Workdir == "" {
			r.st.Workdir = "/"
		}
		return nil
	case StepUser:
		if err := r.shell(ctx, label, "root", "/", userScript(a[0], len(a) > 1 && a[1] == "true")); err != nil {
			return err
		}
		r.st.User = a[0]
		return nil
	}
	return failf(label, "step %s: unknown step type %q", label, st.Type)
}

// copy uploads the step's archive (sanitised) into the sandbox and applies
// it with copyScript as root.
func (r *runner) copy(ctx context.Context, label string, st Step) error {
	if r.files == nil {
		return failf(label, "step %s: COPY needs uploaded files, which builds without the template API have none of", label)
	}
	f, err := r.files.open(ctx, st.FilesHash)
	if err != nil {
		return failf(label, "step %s: %v", label, err)
	}
	defer f.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(sanitizeTar(f, pw)) }()
	archive := "/tmp/.cube-copy-" + st.FilesHash[:16] + "-" + newUUID()[:8] + ".tar"
	err = r.env.upload(ctx, "root", archive, pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return failf(label, "step %s: upload the files: %v", label, err)
	}
	owner, mode := "", ""
	if len(st.Args) > 2 {
		owner = st.Args[2]
	}
	if len(st.Args) > 3 {
		mode = st.Args[3]
	}
	script := copyScript(archive, st.Args[0], r.st.resolve(st.Args[1]), copyOwner(owner, r.st.User), mode)
	return r.shell(ctx, label, "root", "/", script)
}

// shell runs script, logging its output, and fails the step on a
// non-zero exit.
func (r *runner) shell(ctx context.Context, label, user, cwd, script string) error {
	code, err := r.env.runRaw(ctx, user, cwd, r.st.Env, script, nil, r.line(label))
	if err != nil {
		return failf(label, "step %s: %v", label, err)
	}
	if code != 0 {
		return r.exitError(label, code)
	}
	return nil
}

// line logs an output line of step label and keeps the tail for errors.
func (r *runner) line(label string) func(string) {
	r.tail = r.tail[:0]
	return func(s string) {
		r.log.add(levelInfo, label, s)
		r.tail = append(r.tail, s)
		if len(r.tail) > tailLines {
			r.tail = r.tail[len(r.tail)-tailLines:]
		}
	}
}

func (r *runner) exitError(label string, code int) error {
	msg := fmt.Sprintf("step %s: command exited with status %d", label, code)
	if code < 0 {
		msg = fmt.Sprintf("step %s: command was killed", label)
	}
	if len(r.tail) > 0 {
		msg += ": " + strings.Join(r.tail, "\n")
	}
	return failf(label, "%s", msg)
}

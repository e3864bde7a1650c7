package cubelet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/failpoint"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// A sandbox is made by one pipeline: the steps in createSteps, in order.
// A warm-pool slot is the same pipeline run ahead of time, for no sandbox
// yet and with defaults (the template's resources, the default egress
// policy, envd's own random token, the slot's id as hostname), up to the
// slot's stage: "disk" for a plain slot, "launch" for a pre-started one.
// A create resumes from a slot: the reserve step hands the slot's record
// over to the sandbox, and every later step runs unless the slot did it
// already and its result fits the sandbox. So a cold create, a plain slot
// and a pre-started slot differ only in where the pipeline resumes.
//
// Naming rule: every runtime object (state dir, cgroup, shim, netns pin,
// veth, egress chain, host-port mappings' owner) is named by the record's
// Runtime(), fixed once by the reserve step that made the record: the
// sandbox's id on a cold create, the slot's id ("pool-...") for a slot and
// for the sandbox made from it. Nothing is renamed later. Records of the
// previous version have no RuntimeID when their objects carry the
// sandbox's id (cold creates, and plain slots, which were renamed at
// take); Runtime() falls back to the id for them.
//
// Each step that runs fires failpoint "<kind>/after-<step>" (kind "create",
// or "slot" while a slot is made), so the SIGKILL matrix (crash_test.go)
// can stop the cubelet at every boundary. A failed run undoes what its
// record owns, in reverse order; a crash leaves the owner record, which
// Reconcile finishes or removes.

// Steps of the create pipeline, in order (indexes into createSteps).
const (
	stepReserve     = iota // IP, envd's host port and the owner record (a slot's record handed over)
	stepNetwork            // pinned netns and veth in the dataplane
	stepEgress             // egress policy
	stepDisk               // the writable layer's disk image, formatted
	stepLaunch             // cgroup, shim, init; envd listening
	stepPersonalise        // a slot's running sandbox made the sandbox's
	stepStart              // the template's start command started, its ready command passed
	stepMap                // envd's host port mapped
	stepRunning            // record: running
)

// step is one step of the pipeline.
type step struct {
	name string
	// needed says whether the step runs in b (nil: always). A step a slot
	// ran ahead of time runs again only if its result does not fit.
	needed func(*build) bool
	do     func(*build, context.Context) error
	// undo removes what do made; it tolerates a partial or absent result
	// (nil: nothing of its own, it goes with an earlier step's).
	undo func(*build, context.Context) error
}

var createSteps = [...]step{
	stepReserve:     {name: "reserve", do: (*build).reserve, undo: nil /* the record goes last, see build.undo */},
	stepNetwork:     {name: "network", needed: (*build).networkNeeded, do: (*build).attachNetwork, undo: (*build).detachNetwork},
	stepEgress:      {name: "egress", needed: (*build).egressNeeded, do: (*build).setEgress},
	stepDisk:        {name: "disk", needed: (*build).diskNeeded, do: (*build).makeDisk, undo: (*build).removeDisk},
	stepLaunch:      {name: "launch", needed: (*build).launchNeeded, do: (*build).launch, undo: (*build).stopLaunched},
	stepPersonalise: {name: "personalise", needed: (*build).launchedAhead, do: (*build).personalise},
	stepStart:       {name: "start", needed: (*build).startNeeded, do: (*build).startTemplateCommand},
	stepMap:         {name: "map", needed: (*build).forSandbox, do: (*build).mapEnvd, undo: (*build).unmapEnvd},
	stepRunning:     {name: "running", needed: (*build).forSandbox, do: (*build).recordRunning},
}

// Slot stages: how far a slot's pipeline ran, recorded by name in its slot file.
const (
	stagePlain      = stepDisk   // IP, network, default egress, disk image
	stagePrestarted = stepLaunch // ... and a running sandbox of the pool template
	// stageStarted: ... whose template's start command runs and passed
	// its ready command (poolstart.go). The slot skips personalise on the
	// way: a create taking it still runs that step (launchedAhead).
	stageStarted = stepStart
)

// slotStage reads a slot file's stage: the step called name, one a slot
// can stop after (not one that needs a sandbox).
func slotStage(name string) (int, bool) {
	for _, i := range []int{stepReserve, stepNetwork, stepEgress, stepDisk, stepLaunch, stepStart} {
		if createSteps[i].name == name {
			return i, true
		}
	}
	return 0, false
}

// build is one run of the pipeline: for a sandbox, or ahead of time for a
// pool slot (then rec is the slot's record).
type build struct {
	c    *Cubelet
	kind string // failpoint prefix: "create" or "slot"
	rec  nodestore.Sandbox
	tmpl template.Template // launched (zero for a plain slot)
	// ahead: a pool slot is being made; no sandbox, no host port.
	ahead bool
	// from is the ready slot this create resumes, if any.
	from *poolSlot
	// token is envd's access token (the request's, or the slot's own);
	// envVars the sandbox's.
	token   string
	envVars map[string]string
	// mayKeepSlotToken: the request lets the node choose the token.
	mayKeepSlotToken bool
	hostPort         uint16
	release          func() // drops the IP/port reservation
	// owned: the record is written (or handed over): undo removes it.
	owned bool
	// reached is the last step that ran or may have left something (a
	// resumed slot's stage included).
	reached int
	// initPID and shim are a launched slot's (see poolSlot).
	initPID int
	shim    procID
	st      *stepTimer
	// endTurn ends the create turn a slot is made in (nil: none to end).
	endTurn func()
}

// plan lists the steps b runs, in order, up to and including last.
func (b *build) plan(last int) []int {
	var out []int
	for i := 0; i <= last; i++ {
		if n := createSteps[i].needed; n == nil || n(b) {
			out = append(out, i)
		}
	}
	return out
}

// failpoints lists the failpoints b fires up to last, in order (tests).
func (b *build) failpoints(last int) []string {
	var out []string
	for _, i := range b.plan(last) {
		if i == stepPersonalise {
			for _, p := range personaliseParts {
				out = append(out, b.kind+"/personalise/after-"+p)
			}
		}
		out = append(out, b.kind+"/after-"+createSteps[i].name)
	}
	return out
}

// run runs b's plan up to last. On failure everything b's record owns is
// undone (the slot's steps included once it was handed over).
func (b *build) run(ctx context.Context, last int) (err error) {
	b.st = newStepTimer()
	defer func() {
		if err != nil {
			b.undo(ctx)
		}
	}()
	plan := b.plan(last)
	if b.c.shimNS != nil && slices.Contains(plan, stepLaunch) {
		// A shim started in another mount namespace moves itself into
		// its cgroup, a migration that waits for an RCU grace period on
		// cgroup v1 (~15 ms): start that wait now, alongside the steps
		// before it. Elsewhere nothing migrates: the shim is forked into
		// its cgroup and the init into the sandbox's.
		cgroup.PrimeMigration(nsrt.ShimCgroup(b.c.cfg.CgroupParent))
	}
	for _, i := range plan {
		s := &createSteps[i]
		b.reached = max(b.reached, i)
		if err := s.do(b, ctx); err != nil {
			return err
		}
		b.c.metrics.observeStep(b.kind, s.name, b.st.mark(s.name))
		if err := failpoint.Hit(b.kind + "/after-" + s.name); err != nil {
			return err
		}
	}
	return nil
}

// done drops the allocation reservation: the record holds the IP and port
// now, or the create failed.
func (b *build) done() {
	if b.release != nil {
		b.release()
	}
}

// undo removes what a failed run made, in reverse order, with a bounded
// context of its own (the caller may have gone, the cleanup may not). It
// keeps going past failures; the owner record is deleted last, or, if
// anything is left, marked deleting for the maintenance loop
// (finishDeletes) to finish with a teardown.
func (b *build) undo(ctx context.Context) {
	if !b.owned {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var errs []error
	for i := b.reached; i > stepReserve; i-- {
		if u := createSteps[i].undo; u != nil {
			if err := u(b, ctx); err != nil {
				errs = append(errs, fmt.Errorf("undo %s: %w", createSteps[i].name, err))
			}
		}
	}
	if b.ahead {
		removeQuietly(b.c.slotFilePath(b.rec.ID))
	}
	err := errors.Join(errs...)
	if err == nil {
		err = b.c.store.Delete(b.rec.ID)
	} else {
		rec := b.rec
		rec.State = nodestore.StateDeleting
		err = errors.Join(err, b.c.store.Put(rec))
	}
	if err != nil {
		b.c.log.Error("clean up failed create", "sandbox", b.rec.ID, "runtime", b.rec.Runtime(), "err", err)
	}
}

// Predicates of createSteps.

// doneAhead reports whether the slot b resumes ran step i.
func (b *build) doneAhead(i int) bool { return b.from != nil && i <= b.from.stage }

func (b *build) networkNeeded() bool { return !b.doneAhead(stepNetwork) }

func (b *build) launchNeeded() bool { return !b.doneAhead(stepLaunch) }

func (b *build) forSandbox() bool { return !b.ahead }

func (b *build) launchedAhead() bool { return b.doneAhead(stepLaunch) }

func (b *build) egressNeeded() bool {
	return !b.doneAhead(stepEgress) || !egressOf(b.rec).Equal(slotEgress)
}

func (b *build) diskNeeded() bool {
	size := b.c.diskSizeMB(b.rec)
	return size > 0 && (!b.doneAhead(stepDisk) || b.c.diskSizeMB(b.from.rec) != size)
}

// stepTimer records how long each step took, for debug logs.
type stepTimer struct {
	last  time.Time
	steps []any
}

func newStepTimer() *stepTimer { return &stepTimer{last: time.Now()} }

// mark records step as ended now and returns how long it took.
func (t *stepTimer) mark(step string) time.Duration {
	now := time.Now()
	d := now.Sub(t.last)
	t.steps = append(t.steps, step, d.Round(10*time.Microsecond))
	t.last = now
	return d
}

func (t *stepTimer) attrs() []any { return t.steps }

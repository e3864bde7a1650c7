package cubelet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/template"
)

// Pre-started slots of a template with a start command (template.Defaults
// StartCmd/ReadyCmd) are made up to stageStarted: the slot's pipeline runs
// the start step too, so the start command is up and its ready command
// passed before any create arrives, and a create taking the slot skips the
// start (seconds) as it skips the launch.
//
//   - Environment: in a slot the start command runs with the template's
//     env (template defaults) only; a create's envVars reach envd at take
//     (personalise) and every process started after that, not the start
//     command. Cold creates do the same (startcmd.go), so where a create
//     runs makes no difference; E2B behaves so too (its start command runs
//     at build time). Creates with envVars therefore take such slots.
//   - Which slot fits: one that ran the template's current start and ready
//     commands (poolSlot.started, a hash of both, kept in the slot file);
//     a slot of the template whose commands changed since
//     (template.Registry.UpdateDefaults) is set aside like one of an older
//     digest.
//   - Failure: a start command that fails or is not ready within
//     Config.StartTimeout in a slot fails the slot (its pipeline is undone,
//     the reason logged) and the target is skipped for a backoff that
//     doubles per failure in a row (slotStartBackoff); creates meanwhile
//     run cold, where the start command fails again and the create reports
//     that error to the caller. A template registered again (a rebuild, a
//     fetch) is tried at once.
//   - Take: a started slot's ready command is run once more before the
//     slot is handed to a create (slotStillReady): the slot may have
//     waited for minutes, or been adopted after a cubelet restart, and its
//     start command may have died meanwhile. A slot that fails the check is
//     dropped and the create takes another slot or runs cold.
//   - Turns: a slot is made in a create turn (refill), but its wait for the
//     ready command is not: the turn ends once the start command started,
//     so a slow start command holds no create back.
//   - Restart: Reconcile adopts started slots like other pre-started ones
//     (same runtime stamp, sandbox alive, slot file complete); their start
//     command's processes live in the sandbox and are not restarted.

// errSlotStart marks a slot whose template's start command failed.
var errSlotStart = errors.New("start command failed in a warm-pool slot")

// Backoff of a target whose start command fails in slots.
const (
	slotStartBackoffMin = 5 * time.Second
	slotStartBackoffMax = 5 * time.Minute
)

// slotReadyCheckTimeout bounds the ready command's run when a started slot
// is taken.
const slotReadyCheckTimeout = 5 * time.Second

// startKey identifies tmpl's start and ready commands ("" without a start
// command).
func startKey(tmpl template.Template) string {
	if !hasStartCmd(tmpl) {
		return ""
	}
	sum := sha256.Sum256([]byte(tmpl.Defaults.StartCmd + "\x00" + tmpl.Defaults.ReadyCmd))
	return hex.EncodeToString(sum[:8])
}

// slotStartBackoff is how long a target waits after its fails-th start
// failure in a row.
func slotStartBackoff(fails int) time.Duration {
	d := slotStartBackoffMin
	for i := 1; i < fails && d < slotStartBackoffMax; i++ {
		d *= 2
	}
	return min(d, slotStartBackoffMax)
}

// slotStartFailedLocked notes the outcome of making a slot for target:
// a start failure backs the target off (true: the caller is done with
// it), anything else ends a run of failures. The caller holds c.pool.mu.
func (c *Cubelet) slotStartFailedLocked(target string, err error) bool {
	if !errors.Is(err, errSlotStart) {
		if err == nil {
			delete(c.pool.startFails, target)
		}
		return false
	}
	if c.pool.startFails == nil {
		c.pool.startFails = map[string]int{}
	}
	c.pool.startFails[target]++
	wait := slotStartBackoff(c.pool.startFails[target])
	c.pool.missing[target] = time.Now().Add(wait)
	c.log.Warn("warm pool: template's start command failed in a slot; the slot is dropped and creates start it themselves until the next try",
		"target", target, "failures", c.pool.startFails[target], "retryIn", wait, "err", err)
	return true
}

// slotStillReady runs tmpl's ready command once in started slot s (nil
// when it has none to run).
func (c *Cubelet) slotStillReady(ctx context.Context, s poolSlot, tmpl template.Template) error {
	if s.stage < stageStarted || tmpl.Defaults == nil || tmpl.Defaults.ReadyCmd == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, slotReadyCheckTimeout)
	defer cancel()
	envd := newSandboxEnvd(c.dp.Config().SandboxNetNSPath(s.rec.ID), s.token, tmpl)
	code, out, err := envd.run(ctx, tmpl.Defaults.ReadyCmd)
	if err != nil {
		return fmt.Errorf("ready command %q: %w", tmpl.Defaults.ReadyCmd, err)
	}
	if code != 0 {
		return fmt.Errorf("ready command %q exited %d: %q", tmpl.Defaults.ReadyCmd, code, tail(out, 512))
	}
	return nil
}

package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// Defaults of build ownership (Config.HeartbeatEvery, Config.StaleAfter).
// A build whose owner died is failed within about StaleAfter +
// HeartbeatEvery; a live owner misses six heartbeats before that.
const (
	DefaultHeartbeatEvery = 5 * time.Second
	DefaultStaleAfter     = 30 * time.Second
)

// UploadSecretName names the store's shared secret that signs upload URLs
// when Config.Secret is empty.
const UploadSecretName = "template-upload-url"

// interruptedReason is the failure of a build whose server stopped or
// died while running it.
const interruptedReason = "interrupted: the server restarted during the build; start the build again"

// errLostBuild ends a run whose build another replica failed (its
// heartbeats did not reach the store in time).
var errLostBuild = errors.New("another server failed this build because its heartbeats stopped")

// staleCutoff decides whether the unfinished build b is abandoned, as
// seen by the process owner of instance at now. It returns the cutoff to
// fail it with (FailStaleTemplateBuild fails it only if it was not
// updated since), and false to leave it alone:
//   - a build this process runs is alive (it heartbeats);
//   - a build an earlier process of this instance ran is dead now: that
//     process is gone (the restart case, failed at once);
//   - a build of another owner is dead after staleAfter without heartbeat;
//   - a waiting build has no owner yet (any replica may start it):
//     abandoned after waitingAfter.
func staleCutoff(b store.TemplateBuild, owner, instance string, now time.Time, staleAfter, waitingAfter time.Duration) (time.Time, bool) {
	switch {
	case b.Status == store.BuildWaiting:
		cutoff := now.Add(-waitingAfter)
		return cutoff, b.UpdatedAt.Before(cutoff)
	case b.Status != store.BuildBuilding:
		return time.Time{}, false
	case b.Owner == owner:
		return time.Time{}, false
	case strings.HasPrefix(b.Owner, instance+"#"):
		return b.UpdatedAt.Add(time.Nanosecond), true
	default:
		cutoff := now.Add(-staleAfter)
		return cutoff, b.UpdatedAt.Before(cutoff)
	}
}

// failStale fails the abandoned builds (staleCutoff) and kills their
// build sandboxes. Replicas may run it at once: the store lets one fail a
// build, and only that one kills the sandbox.
func (s *Service) failStale(ctx context.Context) error {
	builds, err := s.cfg.Store.UnfinishedTemplateBuilds(ctx)
	if err != nil {
		return fmt.Errorf("look for abandoned template builds: %w", err)
	}
	now := s.now()
	var errs []error
	for _, b := range builds {
		cutoff, stale := staleCutoff(b, s.owner, s.cfg.Instance, now, s.cfg.StaleAfter, s.cfg.BuildTimeout)
		if !stale {
			continue
		}
		failed, err := s.cfg.Store.FailStaleTemplateBuild(ctx, b.ID, cutoff, reasonJSON(Reason{Message: interruptedReason, Step: stepBase}))
		if err != nil {
			errs = append(errs, fmt.Errorf("fail abandoned template build %s: %w", b.ID, err))
			continue
		}
		if !failed {
			continue // alive after all, or failed by another replica
		}
		s.log.Info("failed an abandoned template build", "build", b.ID, "template", b.Template, "owner", b.Owner, "by", s.owner,
			"last_heartbeat", b.UpdatedAt, "sandbox", b.SandboxID)
		if b.SandboxID != "" {
			if err := s.cfg.Sandboxes.KillSandbox(ctx, b.SandboxID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				s.log.Warn("kill the sandbox of an abandoned build", "build", b.ID, "sandbox", b.SandboxID, "err", err)
			}
			_ = s.cfg.Store.SetTemplateBuildSandbox(ctx, b.ID, "")
		}
	}
	return errors.Join(errs...)
}

// failStaleOnce runs failStale once (every HeartbeatEvery, see every).
func (s *Service) failStaleOnce() {
	if err := s.failStale(s.ctx); err != nil && s.ctx.Err() == nil {
		s.log.Warn("look for abandoned template builds", "err", err)
	}
}

// every runs fn every d in its own goroutine until Close.
func (s *Service) every(d time.Duration, fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-t.C:
			}
			fn()
		}
	}()
}

// heartbeat marks build id alive every HeartbeatEvery until ctx ends. When
// the store says this process no longer owns a building id (another
// replica failed it), it cancels the run with errLostBuild. A failed write
// is only logged: the next one may pass before the build goes stale.
func (s *Service) heartbeat(ctx context.Context, id string, cancel context.CancelCauseFunc) {
	t := time.NewTicker(s.cfg.HeartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owned, err := s.cfg.Store.HeartbeatTemplateBuild(ctx, id, s.owner, s.now())
		switch {
		case err != nil:
			if ctx.Err() == nil {
				s.log.Warn("heartbeat of a template build", "build", id, "err", err)
			}
		case !owned:
			s.log.Warn("template build lost: another server failed it", "build", id)
			cancel(errLostBuild)
			return
		}
	}
}

package pidfd

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestOpenMissing(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	// Reaped: the pid names nothing (until reused, which a test cannot
	// rule out, hence only "not found or someone else").
	if _, err := Open(cmd.Process.Pid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open of a reaped pid: %v", err)
	}
	if _, err := Open(-3); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Open(-3): %v", err)
	}
}

// Wait honours ctx; a duplicate outlives the original; Kill ends the
// process and a second Kill is no error.
func TestWaitKillDup(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p, err := Open(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := p.Dup()
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := p.Wait(ctx); !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait of a live process past the deadline: %v", err)
	}
	if p.Exited() || p.ExitedWithin(context.Background(), 10*time.Millisecond) {
		t.Error("a sleeping process reads as exited")
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if !p.ExitedWithin(context.Background(), 5*time.Second) {
		t.Fatal("killed process did not exit")
	}
	e, err := p.ChildExit(true)
	if err != nil || e.Code != -1 || e.Signal != "SIGKILL" {
		t.Errorf("ChildExit = %+v, %v", e, err)
	}
	p.Close()
	if !dup.Exited() {
		t.Error("the duplicate does not see the exit")
	}
	if err := dup.Kill(); err != nil {
		t.Errorf("Kill after exit: %v", err)
	}
}

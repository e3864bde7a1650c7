package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestBuilderWaits(t *testing.T) {
	release := make(chan struct{})
	var builds atomic.Int32
	fail := atomic.Bool{}
	fail.Store(true)
	b := NewBuilder(context.Background(), InterpName, func(ctx context.Context) (Template, error) {
		builds.Add(1)
		<-release
		if fail.Load() {
			return Template{}, errors.New("mirror down")
		}
		return Template{Name: InterpName}, nil
	})
	// A waiter whose Wait started the build waits on that build: its
	// failure is the waiter's answer (a Wait after a failure retries).
	errc := make(chan error, 1)
	go func() {
		_, err := b.Wait(context.Background(), 10*time.Second)
		errc <- err
	}()
	for builds.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	// Still building: a bounded wait, a message that says so.
	_, err := b.Wait(context.Background(), 20*time.Millisecond)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "still being built") {
		t.Fatalf("while building: %v", err)
	}
	b.Start() // joins the running build
	release <- struct{}{}
	if err := <-errc; !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "mirror down") {
		t.Fatalf("failed build: %v", err)
	}
	if n := builds.Load(); n != 1 {
		t.Fatalf("%d builds, want 1", n)
	}
	// The next wait tries again, and succeeds.
	fail.Store(false)
	close(release)
	tm, err := b.Wait(context.Background(), 5*time.Second)
	if err != nil || tm.Name != InterpName {
		t.Fatalf("retry: %v %v", tm, err)
	}
	if _, err := b.Wait(context.Background(), 10*time.Second); err != nil || builds.Load() != 2 {
		t.Fatalf("after success: %v, %d builds", err, builds.Load())
	}
}

func TestInterpMarker(t *testing.T) {
	root := t.TempDir()
	if HasInterp(root) {
		t.Error("empty rootfs has the marker")
	}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(InterpMarker)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, InterpMarker), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !HasInterp(root) {
		t.Error("marker not found after writing it")
	}
}

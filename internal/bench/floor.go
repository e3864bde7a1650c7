package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FloorCloneFlags are the namespaces the floor creates: the same set as a
// Cube sandbox's init (pid, mount, net, uts, ipc), via clone.
const FloorCloneFlags = unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC

// FloorResult is the floor measured in the same run as Cube.
type FloorResult struct {
	Binary     string  `json:"binary"`
	Serial     Summary `json:"serial"`
	Concurrent Summary `json:"concurrent"`
	// Concurrency is the burst size of Concurrent.
	Concurrency int `json:"concurrency"`
}

// FloorOnce starts bin in new pid+mount+net+uts+ipc namespaces (clone +
// exec) with one end of a socketpair on fd 3, sends it one byte and returns
// the time until its answer arrived; then it closes the socket (the
// responder exits on EOF) and reaps it.
func FloorOnce(ctx context.Context, bin string) (time.Duration, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "floor")
	theirs := os.NewFile(uintptr(fds[1]), "floor-child")
	defer ours.Close()
	cmd := exec.CommandContext(ctx, bin)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: FloorCloneFlags, Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", bin, err)
	}
	var b [1]byte
	_, err = ours.Write([]byte{'?'})
	if err == nil {
		_ = ours.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(ours, b[:])
	}
	d := time.Since(t0)
	ours.Close()
	werr := cmd.Wait()
	if err != nil {
		return 0, fmt.Errorf("floor responder did not answer: %w (exit: %v)", err, werr)
	}
	if b[0] != '!' {
		return 0, fmt.Errorf("floor responder answered %q, want '!'", b[0])
	}
	return d, nil
}

// RunFloor measures the floor n times one at a time and n times in bursts
// of conc.
func RunFloor(ctx context.Context, bin string, n, conc int) FloorResult {
	var serial, burst Samples
	for i := 0; i < n && ctx.Err() == nil; i++ {
		serial.Add(FloorOnce(ctx, bin))
	}
	for done := 0; done < n && ctx.Err() == nil; done += conc {
		k := min(conc, n-done)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		var released time.Time
		for range k {
			wg.Go(func() {
				<-gate
				// Timed from the burst's start, as the concurrent creates
				// are: a fork holds its P until the child execs
				// (vfork), so the burst's later goroutines start late and
				// their own clock would leave out that wait.
				_, err := FloorOnce(ctx, bin)
				burst.Add(time.Since(released), err)
			})
		}
		released = time.Now()
		close(gate)
		wg.Wait()
	}
	return FloorResult{Binary: bin, Serial: serial.Summary(), Concurrent: burst.Summary(), Concurrency: conc}
}

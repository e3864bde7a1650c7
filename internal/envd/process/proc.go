package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/errdefs"
)

const (
	// ringLimit bounds the output kept per process for clients that attach
	// later with Connect.
	ringLimit = 256 << 10
	// readChunk is the size of one read from a process's output.
	readChunk = 32 << 10
	// drainGrace is how long output is still collected after the process has
	// exited, for grandchildren that keep the pipes open.
	drainGrace = 2 * time.Second
	// subscriberQueue is the per-client event queue length.
	subscriberQueue = 16
)

// proc is one process started by envd, with its output fan-out.
type proc struct {
	pid    uint32
	tag    *string
	config *pb.ProcessConfig
	cmd    *exec.Cmd

	stdin *os.File // write end of the stdin pipe; nil without stdin
	ptmx  *os.File // PTY master; nil without PTY
	outs  []*os.File
	out   chan *pb.ProcessEvent

	mu          sync.Mutex
	ring        []*pb.ProcessEvent
	ringBytes   int
	subs        map[*subscriber]struct{}
	end         *pb.ProcessEvent
	stdinClosed bool
	timer       *time.Timer

	done chan struct{} // closed after the end event was published
}

// subscriber is one attached client.
type subscriber struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{}
	once sync.Once
}

func (s *subscriber) close() { s.once.Do(func() { close(s.gone) }) }

// subscribe attaches a client. With replay, it also returns the buffered
// output (and the end event if the process already finished); events
// published later arrive on the subscriber's channel.
func (p *proc) subscribe(replay bool) (*subscriber, []*pb.ProcessEvent) {
	sub := &subscriber{ch: make(chan *pb.ProcessEvent, subscriberQueue), gone: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	var past []*pb.ProcessEvent
	if replay {
		past = append(past, p.ring...)
	}
	if p.end != nil {
		past = append(past, p.end)
		return sub, past
	}
	p.subs[sub] = struct{}{}
	return sub, past
}

func (p *proc) unsubscribe(sub *subscriber) {
	p.mu.Lock()
	delete(p.subs, sub)
	p.mu.Unlock()
	sub.close()
}

// publish records ev and hands it to every attached client, waiting for slow
// ones (back-pressure) but never for a client that detached.
func (p *proc) publish(ev *pb.ProcessEvent, record bool) {
	p.mu.Lock()
	if record {
		n := dataLen(ev)
		p.ring = append(p.ring, ev)
		p.ringBytes += n
		for p.ringBytes > ringLimit && len(p.ring) > 1 {
			p.ringBytes -= dataLen(p.ring[0])
			p.ring[0] = nil
			p.ring = p.ring[1:]
		}
	} else {
		p.end = ev
	}
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func dataLen(ev *pb.ProcessEvent) int {
	d := ev.GetData()
	return len(d.GetStdout()) + len(d.GetStderr()) + len(d.GetPty())
}

// run starts the output readers and the lifecycle goroutine; onExit is
// called after the end event was published.
func (p *proc) run(onExit func()) {
	var readers sync.WaitGroup
	for i, f := range p.outs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			p.read(f, i)
		}()
	}
	readersDone := make(chan struct{})
	go func() {
		readers.Wait()
		close(readersDone)
	}()
	distributed := make(chan struct{})
	go func() {
		defer close(distributed)
		for ev := range p.out {
			p.publish(ev, true)
		}
	}()
	go func() {
		waitErr := p.cmd.Wait()
		p.mu.Lock()
		if p.timer != nil {
			p.timer.Stop()
		}
		p.mu.Unlock()
		grace := time.NewTimer(drainGrace)
		select {
		case <-readersDone:
		case <-grace.C:
			for _, f := range p.outs {
				_ = f.Close() // unblocks readers held by grandchildren
			}
			<-readersDone
		}
		grace.Stop()
		close(p.out)
		<-distributed
		for _, f := range p.outs {
			_ = f.Close()
		}
		p.mu.Lock()
		if p.stdin != nil && !p.stdinClosed {
			p.stdinClosed = true
			_ = p.stdin.Close()
		}
		p.mu.Unlock()
		p.publish(endEvent(p.cmd.ProcessState, waitErr), false)
		close(p.done)
		onExit()
	}()
}

// read copies one output stream into events; index 0 is stdout (or the
// PTY), 1 is stderr.
func (p *proc) read(f *os.File, index int) {
	buf := make([]byte, readChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			data := &pb.ProcessEvent_DataEvent{}
			switch {
			case p.ptmx != nil:
				data.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: chunk}
			case index == 0:
				data.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: chunk}
			default:
				data.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: chunk}
			}
			p.out <- &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: data}}
		}
		if err != nil {
			return
		}
	}
}

func endEvent(st *os.ProcessState, waitErr error) *pb.ProcessEvent {
	end := &pb.ProcessEvent_EndEvent{}
	if st != nil {
		end.ExitCode = int32(st.ExitCode())
		end.Exited = st.Exited()
		end.Status = st.String()
	}
	if waitErr != nil {
		msg := waitErr.Error()
		end.Error = &msg
		if st == nil {
			end.ExitCode = -1
			end.Status = msg
		}
	}
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
}

// signal sends sig to the process group (so children die with it), falling
// back to the process alone.
func (p *proc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("process %d: already finished: %w", p.pid, errdefs.ErrNotFound)
	default:
	}
	if err := syscall.Kill(-int(p.pid), sig); err == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("process %d: already finished: %w", p.pid, errdefs.ErrNotFound)
		}
		return fmt.Errorf("signal process %d: %w", p.pid, err)
	}
	return nil
}

// writeInput writes to stdin (pty=false) or the PTY (pty=true).
func (p *proc) writeInput(data []byte, toPTY bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var f *os.File
	switch {
	case toPTY && p.ptmx == nil:
		return fmt.Errorf("process %d has no PTY: %w", p.pid, errdefs.ErrFailedPrecondition)
	case toPTY:
		f = p.ptmx
	case p.ptmx != nil:
		f = p.ptmx // stdin of a PTY process is the PTY
	case p.stdin == nil:
		return fmt.Errorf("process %d was started without stdin: %w", p.pid, errdefs.ErrFailedPrecondition)
	case p.stdinClosed:
		return fmt.Errorf("process %d: stdin is closed: %w", p.pid, errdefs.ErrFailedPrecondition)
	default:
		f = p.stdin
	}
	if _, err := f.Write(data); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("process %d: input closed: %w", p.pid, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("write input to process %d: %w", p.pid, err)
	}
	return nil
}

// closeStdin closes the stdin pipe so the process reads EOF. For a PTY
// process it sends the terminal's EOF character (Ctrl-D).
func (p *proc) closeStdin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.ptmx != nil:
		_, err := p.ptmx.Write([]byte{4})
		return err
	case p.stdin == nil:
		return fmt.Errorf("process %d was started without stdin: %w", p.pid, errdefs.ErrFailedPrecondition)
	case p.stdinClosed:
		return nil
	}
	p.stdinClosed = true
	return p.stdin.Close()
}

func (p *proc) resize(size *pb.PTY_Size) error {
	if p.ptmx == nil {
		return fmt.Errorf("process %d has no PTY: %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	if size == nil || size.GetCols() == 0 || size.GetRows() == 0 || size.GetCols() > 0xffff || size.GetRows() > 0xffff {
		return fmt.Errorf("pty size must have cols and rows in 1..65535: %w", errdefs.ErrInvalidArgument)
	}
	return pty.Setsize(p.ptmx, &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())})
}

func (p *proc) info() *pb.ProcessInfo {
	return &pb.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag}
}

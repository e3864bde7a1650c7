package interp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	// keepaliveInterval: a quiet execution still writes a line this often,
	// so a client that vanished without closing is noticed (the write
	// fails) and its execution interrupted. Clients ignore the type.
	keepaliveInterval = 5 * time.Second
	// interruptGrace is how long an interrupted execution may take to end
	// before its kernel is given up as stuck (and restarted by the next
	// execution).
	interruptGrace = 10 * time.Second
)

// Why a kernel stopped, for the execution that was running on it.
var (
	errKernelDied    = errors.New("kernel died")
	errKernelStuck   = errors.New("kernel did not stop after an interrupt")
	errStopRestarted = errors.New("context restarted")
	errStopRemoved   = errors.New("context removed")
)

// executeRequest is the content of a Jupyter execute_request.
type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    bool           `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	AllowStdin      bool           `json:"allow_stdin"`
	StopOnError     bool           `json:"stop_on_error"`
}

// execute runs code on the kernel and passes every output line (the
// /execute stream's objects, see lines.go) to emit, in the kernel's order.
// It returns when the kernel is idle again. When ctx ends (the client went
// away or gave up) or emit fails, the kernel is interrupted and the rest of
// the execution is drained without emitting; a kernel that does not stop
// within interruptGrace yields errKernelStuck. A kernel that exits yields
// errKernelDied (or the reason it was stopped), after an error line.
func (k *kernel) execute(ctx context.Context, code string, silent bool, emit func(any) error) error {
	id := newID()
	ch := k.register(id)
	defer k.unregister(id)
	// StopOnError false: this server runs one execution per context at a
	// time, so there is no queue to abort after an error, and ipykernel's
	// abort window (until its event loop turns) would otherwise abort the
	// next execution when it arrives right after an error or interrupt
	// ("ExecutionAborted", seen under load in TestTimeoutInterrupts).
	req := executeRequest{Code: code, Silent: silent, StoreHistory: !silent, UserExpressions: map[string]any{}}
	if err := k.send(k.shell, "execute_request", id, req); err != nil {
		return err
	}
	keepalive := time.NewTicker(keepaliveInterval)
	defer keepalive.Stop()
	var (
		lines    = executionLines{silent: silent}
		emitting = true
		done     = ctx.Done()
		grace    <-chan time.Time
	)
	stopEmitting := func() {
		if !emitting {
			return
		}
		emitting, done = false, nil
		if err := k.interrupt(); err != nil {
			k.log.Warn("interrupt kernel", "err", err)
		}
		grace = time.After(interruptGrace)
	}
	out := func(line any) {
		if line == nil || !emitting {
			return
		}
		if err := emit(line); err != nil {
			stopEmitting()
		}
	}
	for !lines.complete() {
		select {
		case m := <-ch:
			lines.take(m, out)
		case <-k.exited:
			// What the kernel sent just before it exited is still on its
			// way (e.g. a print before os._exit): take it first.
			for drain := time.After(100 * time.Millisecond); ; {
				select {
				case m := <-ch:
					if t := m.Header.MsgType; t != "status" && t != "execute_reply" && t != "error" {
						out(outputLine(m))
					}
					continue
				case <-drain:
				}
				break
			}
			reason := k.stopReason()
			out(kernelGoneLine(reason, k))
			return reason
		case <-done:
			stopEmitting()
		case <-grace:
			return errKernelStuck
		case <-keepalive.C:
			out(map[string]string{"type": "keepalive"})
		}
	}
	if lines.finish(out) && silent {
		return errors.New("silent execution failed")
	}
	return nil
}

// executionLines turns one execution's kernel messages into the client's
// lines in the kernel's order, with one error line at most. The
// execute_reply comes on the shell socket and may overtake iopub's stream
// and error messages, so the error it carries waits until the execution is
// complete: iopub's idle comes after all of them.
type executionLines struct {
	silent                 bool
	idle, replied, errored bool
	replyErr               any
}

// take handles one message of the execution, passing lines to out.
func (e *executionLines) take(m message, out func(any)) {
	switch m.Header.MsgType {
	case "status":
		var c struct {
			State string `json:"execution_state"`
		}
		_ = json.Unmarshal(m.Content, &c)
		e.idle = e.idle || c.State == "idle"
	case "execute_reply":
		e.replied = true
		e.replyErr = replyLine(m)
	case "error":
		if !e.errored {
			e.errored = true
			out(errorLine(m))
		}
	default:
		if !e.silent || m.Header.MsgType == "stream" {
			out(outputLine(m))
		}
	}
}

// complete reports whether the kernel replied and is idle again.
func (e *executionLines) complete() bool { return e.idle && e.replied }

// finish emits the reply's error if iopub published none, and reports
// whether the execution failed.
func (e *executionLines) finish(out func(any)) bool {
	if e.replyErr != nil && !e.errored {
		e.errored = true
		out(e.replyErr)
	}
	return e.errored
}

// outputLine turns an iopub message into a stream line, or nil for the
// message types the client does not model.
func outputLine(m message) any {
	switch m.Header.MsgType {
	case "stream":
		var c struct{ Name, Text string }
		if json.Unmarshal(m.Content, &c) != nil || (c.Name != "stdout" && c.Name != "stderr") {
			return nil
		}
		return map[string]string{"type": c.Name, "text": c.Text, "timestamp": m.Header.Date}
	case "execute_input":
		var c struct {
			ExecutionCount int `json:"execution_count"`
		}
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return map[string]any{"type": "number_of_executions", "execution_count": c.ExecutionCount}
	case "execute_result", "display_data":
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		if json.Unmarshal(m.Content, &c) != nil {
			return nil
		}
		return resultLine(c.Data, m.Header.MsgType == "execute_result")
	}
	return nil
}

// resultFields maps MIME types to the result fields the client models.
var resultFields = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}

// resultLine is a "result" line: each MIME bundle entry under the client's
// field name (JSON values stay JSON), others under "extra". A text/plain
// repr of a string loses its quotes, as upstream's server does.
func resultLine(data map[string]json.RawMessage, main bool) map[string]any {
	line := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	for mime, raw := range data {
		field, known := resultFields[mime]
		var v any = raw
		var s string
		if json.Unmarshal(raw, &s) == nil {
			v = s
		}
		if !known {
			extra[mime] = v
			continue
		}
		if field == "text" && len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
			v = s[1 : len(s)-1]
		}
		line[field] = v
	}
	if len(extra) > 0 {
		line["extra"] = extra
	}
	return line
}

// errorContent is the content of an iopub error and of an execute_reply
// with status error.
type errorContent struct {
	Status    string   `json:"status"`
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

func errorLine(m message) any {
	var c errorContent
	if json.Unmarshal(m.Content, &c) != nil {
		return nil
	}
	return errLine(c.Ename, c.Evalue, strings.Join(c.Traceback, ""))
}

// replyLine is the error line an execute_reply carries, if any: an error
// the kernel did not publish on iopub, or an aborted execution.
func replyLine(m message) any {
	var c errorContent
	if json.Unmarshal(m.Content, &c) != nil {
		return nil
	}
	switch c.Status {
	case "error":
		return errLine(c.Ename, c.Evalue, strings.Join(c.Traceback, ""))
	case "aborted", "abort":
		return errLine("ExecutionAborted", "Execution was aborted", "")
	}
	return nil
}

func errLine(name, value, traceback string) map[string]string {
	return map[string]string{"type": "error", "name": name, "value": value, "traceback": traceback}
}

// kernelGoneLine is the error line of an execution whose kernel stopped.
func kernelGoneLine(reason error, k *kernel) any {
	switch {
	case errors.Is(reason, errStopRestarted):
		return errLine("ContextRestarting", "Context was restarted", "")
	case errors.Is(reason, errStopRemoved):
		return errLine("ContextRemoved", "Context was removed", "")
	}
	return errLine("KernelDied", fmt.Sprintf("the kernel exited (%v); its state is lost: the next execution in this context starts a new kernel", k.exitErr), "")
}

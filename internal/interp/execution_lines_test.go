package interp

import (
	"encoding/json"
	"slices"
	"testing"
)

func kernelMessage(t *testing.T, msgType string, content any) message {
	t.Helper()
	raw, err := json.Marshal(content)
	if err != nil {
		t.Fatal(err)
	}
	return message{Header: header{MsgType: msgType}, Content: raw}
}

// The shell socket's execute_reply may arrive before iopub's stream and
// error (seen in CI: error before stdout); the lines keep iopub's order and
// carry one error.
func TestExecutionLinesReplyOvertakesIopub(t *testing.T) {
	failure := map[string]any{"status": "error", "ename": "ValueError", "evalue": "bad", "traceback": []string{"tb"}}
	in := []message{
		kernelMessage(t, "execute_reply", failure),
		kernelMessage(t, "execute_input", map[string]any{"execution_count": 1}),
		kernelMessage(t, "stream", map[string]any{"name": "stdout", "text": "before\n"}),
		kernelMessage(t, "error", failure),
		kernelMessage(t, "status", map[string]any{"execution_state": "idle"}),
	}
	var types []string
	outLine := collectTypes(&types)
	lines := executionLines{}
	for _, m := range in {
		if lines.complete() {
			t.Fatal("complete before idle")
		}
		lines.take(m, outLine)
	}
	if !lines.complete() || !lines.finish(outLine) {
		t.Fatal("not complete, or not failed")
	}
	if want := []string{"number_of_executions", "stdout", "error:ValueError"}; !slices.Equal(types, want) {
		t.Errorf("lines %v, want %v", types, want)
	}
}

// An error only the reply carries (an aborted execution) is still one line,
// after the output.
func TestExecutionLinesErrorOnlyInReply(t *testing.T) {
	var types []string
	out := collectTypes(&types)
	lines := executionLines{}
	lines.take(kernelMessage(t, "execute_reply", map[string]any{"status": "aborted"}), out)
	lines.take(kernelMessage(t, "stream", map[string]any{"name": "stderr", "text": "x"}), out)
	lines.take(kernelMessage(t, "status", map[string]any{"execution_state": "idle"}), out)
	if !lines.finish(out) {
		t.Fatal("aborted execution not failed")
	}
	if want := []string{"stderr", "error:ExecutionAborted"}; !slices.Equal(types, want) {
		t.Errorf("lines %v, want %v", types, want)
	}
}

// collectTypes records each line's type (and an error's name).
func collectTypes(types *[]string) func(any) {
	return func(line any) {
		switch l := line.(type) {
		case map[string]string:
			if l["type"] == "error" {
				*types = append(*types, "error:"+l["name"])
				return
			}
			*types = append(*types, l["type"])
		case map[string]any:
			*types = append(*types, l["type"].(string))
		}
	}
}

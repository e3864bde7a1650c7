package interp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	s := signer{key: []byte("k")}
	frames, err := s.encode("sess", "execute_request", "id1", executeRequest{Code: "1"})
	if err != nil {
		t.Fatal(err)
	}
	// A router prepends identities; a pub socket a topic.
	m, err := s.decode(append([][]byte{[]byte("ident")}, frames...))
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.MsgType != "execute_request" || m.Header.MsgID != "id1" || m.Header.Session != "sess" || m.Header.Version != protocolVersion {
		t.Errorf("header %+v", m.Header)
	}
	var c executeRequest
	if err := json.Unmarshal(m.Content, &c); err != nil || c.Code != "1" {
		t.Errorf("content %s", m.Content)
	}
	frames[5] = []byte(`{"code":"2"}`) // tampered content
	if _, err := s.decode(frames); !errors.Is(err, errBadSignature) {
		t.Errorf("tampered: %v", err)
	}
	if _, err := (signer{key: []byte("other")}).decode(frames); !errors.Is(err, errBadSignature) {
		t.Errorf("other key: %v", err)
	}
	if _, err := s.decode(frames[:4]); err == nil {
		t.Error("short message accepted")
	}
}

func TestResultLine(t *testing.T) {
	raw := map[string]json.RawMessage{
		"text/plain":       json.RawMessage(`"'quoted'"`),
		"application/json": json.RawMessage(`{"a":1}`),
		"image/png":        json.RawMessage(`"iVBOR"`),
		"application/x-y":  json.RawMessage(`"other"`),
	}
	l := resultLine(raw, true)
	if l["text"] != "quoted" || l["png"] != "iVBOR" || l["is_main_result"] != true || l["type"] != "result" {
		t.Errorf("line %v", l)
	}
	if _, ok := l["json"].(json.RawMessage); !ok {
		t.Errorf("json field %T, want raw JSON", l["json"])
	}
	if extra, _ := l["extra"].(map[string]any); extra["application/x-y"] != "other" {
		t.Errorf("extra %v", l["extra"])
	}
}

// The client's request fixtures (testdata/client-requests.json, written
// from @e2b/code-interpreter 2.8.0's runCode/createCodeContext) decode.
func TestClientRequestFixtures(t *testing.T) {
	b, err := os.ReadFile("testdata/client-requests.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx map[string]json.RawMessage
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	var ex ExecuteRequest
	if err := json.Unmarshal(fx["runCodeEnvs"], &ex); err != nil || ex.Code == nil || ex.EnvVars["A"] != "1" {
		t.Errorf("runCodeEnvs: %+v %v", ex, err)
	}
	ex = ExecuteRequest{}
	if err := json.Unmarshal(fx["runCodeContext"], &ex); err != nil || ex.ContextID != "CONTEXT_ID" {
		t.Errorf("runCodeContext: %+v %v", ex, err)
	}
	var cc CreateContextRequest
	if err := json.Unmarshal(fx["createCodeContext"], &cc); err != nil || cc.Cwd != "/tmp" || cc.Language != "python" {
		t.Errorf("createCodeContext: %+v %v", cc, err)
	}
	// The stream lines the client parses are the ones this server writes.
	lines, err := os.ReadFile("testdata/client-lines.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(lines))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m["type"] == nil {
			t.Errorf("fixture line %q", sc.Text())
		}
	}
}

func FuzzDecode(f *testing.F) {
	s := signer{key: []byte("k")}
	frames, _ := s.encode("s", "status", "id", map[string]string{"execution_state": "idle"})
	f.Add(bytes.Join(frames, []byte{0}))
	f.Add([]byte("<IDS|MSG>\x00\x00{}\x00{}\x00{}\x00{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		parts := bytes.Split(data, []byte{0})
		_, _ = signer{}.decode(parts)
		_, _ = s.decode(parts)
	})
}

func FuzzExecuteRequest(f *testing.F) {
	b, _ := os.ReadFile("testdata/client-requests.json")
	var fx map[string]json.RawMessage
	_ = json.Unmarshal(b, &fx)
	for _, v := range fx {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req ExecuteRequest
		_ = json.Unmarshal(data, &req)
	})
}

package shim

import (
	"bufio"
	"io"
	"strings"
	"testing"
)

// TestReadAnswer: the answers the client must understand (the supervisor's:
// Content-Length and Connection: close) and the ones it must refuse rather
// than misread.
func TestReadAnswer(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		code      int
		body      string
		wantErr   string
	}{
		{name: "supervisor", raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\nConnection: close\r\n\r\n{\"shim\":42}\n",
			code: 200, body: "{\"shim\":42}\n"},
		{name: "error status", raw: "HTTP/1.1 412 Precondition Failed\r\ncontent-length: 17\r\n\r\n{\"error\":\"nope\"}\n",
			code: 412, body: "{\"error\":\"nope\"}\n"},
		{name: "body to close", raw: "HTTP/1.0 200 OK\r\n\r\n{}\n", code: 200, body: "{}\n"},
		{name: "bare LF", raw: "HTTP/1.1 404 Not Found\nContent-Length: 2\n\n{}", code: 404, body: "{}"},
		{name: "short body", raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", wantErr: "unexpected EOF"},
		{name: "no head", raw: "", wantErr: "unexpected EOF"},
		{name: "cut head", raw: "HTTP/1.1 200 OK\r\nContent-Len", wantErr: "unexpected EOF"},
		{name: "not http", raw: "SSH-2.0-OpenSSH\r\n\r\n", wantErr: "malformed status line"},
		{name: "bad status", raw: "HTTP/1.1 2x0 OK\r\n\r\n", wantErr: "malformed status line"},
		{name: "bad length", raw: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", wantErr: "malformed Content-Length"},
		{name: "chunked", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", wantErr: "Transfer-Encoding"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body, err := readAnswer(bufio.NewReader(strings.NewReader(c.raw)))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("readAnswer = %d %q %v, want error containing %q", code, body, err, c.wantErr)
				}
				return
			}
			if err != nil || code != c.code || string(body) != c.body {
				t.Fatalf("readAnswer = %d %q %v, want %d %q", code, body, err, c.code, c.body)
			}
		})
	}
	// An answer larger than the bound is cut, not read without end.
	big := "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("x", 2*maxAnswer)
	_, body, err := readAnswer(bufio.NewReader(io.LimitReader(strings.NewReader(big), maxAnswer)))
	if err != nil || len(body) >= maxAnswer {
		t.Fatalf("oversized answer: %d bytes, %v", len(body), err)
	}
}

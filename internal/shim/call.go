package shim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/supervisor"
)

// The supervisor's API is HTTP/1.1 on a unix socket: one request per
// connection, no request body, a small JSON answer with Content-Length and
// Connection: close (see supervisor's server). The client speaks just
// that, by hand: with net/http this package, and so every binary that
// carries the namespace runtime (cube-shim, started three times per
// create), would link net/http and crypto/tls, ~0.4 ms more CPU and
// ~60 more dirty pages per start, measured.

// maxAnswer bounds an answer's head and body: a State is a few hundred bytes.
const maxAnswer = 64 << 10

// call sends method path to the supervisor and decodes its JSON answer into
// out (unless nil). A socket that is missing or refuses is ErrNotFound (no
// supervisor listens); other failures are ErrUnavailable; a non-200 answer
// carries the error kind of its status.
func (c *Client) call(ctx context.Context, method, path string, out any) error {
	code, body, err := exchange(ctx, filepath.Join(c.stateDir, supervisor.SocketFile), method, path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("shim %d: %w: %w", c.info.PID, errdefs.ErrNotFound, err)
		}
		return fmt.Errorf("shim %d: %w: %w", c.info.PID, errdefs.ErrUnavailable, err)
	}
	if code != 200 {
		var eb supervisor.ErrorBody
		_ = json.Unmarshal(body, &eb)
		return fmt.Errorf("shim %d %s %s: %s: %w", c.info.PID, method, path, eb.Error, kindOf(code))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("shim %d %s: decode: %w", c.info.PID, path, err)
	}
	return nil
}

// exchange makes one request on a fresh connection to the unix socket at
// sock and returns the answer's status and body. It ends when ctx does.
func exchange(ctx context.Context, sock, method, path string) (code int, body []byte, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}()
	req := method + " " + path + " HTTP/1.1\r\nHost: shim\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return 0, nil, fmt.Errorf("send request: %w", err)
	}
	return readAnswer(bufio.NewReaderSize(io.LimitReader(conn, maxAnswer), 1024))
}

// readAnswer parses an HTTP/1.x response: the status line, the headers
// (only Content-Length and Transfer-Encoding matter) and the body, which is
// Content-Length bytes or, without it, everything up to the close.
func readAnswer(r *bufio.Reader) (code int, body []byte, err error) {
	line, err := readHeaderLine(r)
	if err != nil {
		return 0, nil, err
	}
	proto, rest, _ := strings.Cut(line, " ")
	status, _, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(proto, "HTTP/1.") || len(status) != 3 {
		return 0, nil, fmt.Errorf("malformed status line %q", line)
	}
	if code, err = strconv.Atoi(status); err != nil {
		return 0, nil, fmt.Errorf("malformed status line %q", line)
	}
	length := -1
	for {
		h, err := readHeaderLine(r)
		if err != nil {
			return 0, nil, err
		}
		if h == "" {
			break
		}
		name, value, _ := strings.Cut(h, ":")
		value = strings.TrimSpace(value)
		switch {
		case strings.EqualFold(name, "Content-Length"):
			if length, err = strconv.Atoi(value); err != nil || length < 0 {
				return 0, nil, fmt.Errorf("malformed Content-Length %q", value)
			}
		case strings.EqualFold(name, "Transfer-Encoding") && !strings.EqualFold(value, "identity"):
			return 0, nil, fmt.Errorf("unsupported Transfer-Encoding %q", value)
		}
	}
	if length < 0 {
		body, err = io.ReadAll(r)
	} else {
		body = make([]byte, length)
		_, err = io.ReadFull(r, body)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read answer body: %w", err)
	}
	return code, body, nil
}

func readHeaderLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read answer: %w", eofIsUnexpected(err))
	}
	return strings.TrimRight(line, "\r\n"), nil
}

package multihost_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// relay forwards TCP connections accepted on listen to target. The test
// PostgreSQL (internal/pgtest) listens on loopback of the test's netns; the
// relay, on the test's bridge address, lets servers in their own netns reach
// it. A connection closed on one side is closed on the other, so a killed
// server's sessions (and its advisory locks) end in PostgreSQL at once.
func relay(t *testing.T, listen, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			track(a, true)
			track(b, true)
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				io.Copy(dst, src)
				dst.Close()
				src.Close()
				track(dst, false)
				track(src, false)
			}
			go pipe(a, b)
			go pipe(b, a)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

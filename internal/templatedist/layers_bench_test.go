package templatedist_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/cube-dev/cube/internal/rootfstest"
)

// BenchmarkFetchLayered: a node holding base fetches child (base plus a
// 4 MiB layer, committed on the server) through Handler and Fetcher over
// HTTP: only child's layer travels; the node stacks it on its base (a
// LinkTree of base plus the layer) and checks the result's digest. It
// reports the response bytes per fetch as wire-B/op.
func BenchmarkFetchLayered(b *testing.B) { benchFetch(b, nil, 2) }

// BenchmarkFetchFull is BenchmarkFetchLayered from a server that publishes
// no layers, as servers before layered templates did (and as older nodes
// read any server's answer): child's full rootfs travels as one stream.
func BenchmarkFetchFull(b *testing.B) {
	benchFetch(b, tamper("/templates/child", noLayers), 0)
}

// benchFetch fetches child into a node holding base, deleting the node's
// child between fetches (untimed; b.Loop runs the setup once); layers is
// the length of the stack the node's child must have (0: flat).
func benchFetch(b *testing.B, wrap func(http.Handler) http.Handler, layers int) {
	s := serveRegistry(b, wrap)
	base, what := rootfstest.Base(b, s.reg)
	b.Logf("base: %s", what)
	child := commit(b, s.reg, "child", base, func(root string) { rootfstest.Change(b, root) })
	node := nodeRegistry(b)
	f := s.fetcher()
	f.Logger = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	if _, err := f.Fetch(ctx, node, "base"); err != nil {
		b.Fatal(err)
	}
	s.log.reset()
	for b.Loop() {
		got, err := f.Fetch(ctx, node, "child")
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if got.Digest != child.Digest || len(got.Layers) != layers {
			b.Fatalf("fetched %s with %d layers, want %s with %d", got.Digest, len(got.Layers), child.Digest, layers)
		}
		if err := node.Delete(ctx, "child"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	_, bytes := s.log.snapshot()
	var total int64
	for _, n := range bytes {
		total += n
	}
	b.ReportMetric(float64(total)/float64(b.N), "wire-B/op")
}

package nodeapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// layerNode ships one layer: deterministic bytes over several chunks.
type layerNode struct {
	Cubelet
	data []byte
}

func (n *layerNode) ReadLayer(_ context.Context, digest string, w io.Writer) error {
	if digest != "sha256:known" {
		return fmt.Errorf("layer %s: %w", digest, errdefs.ErrNotFound)
	}
	for p := n.data; len(p) > 0; {
		k := min(len(p), 100_000) // odd writes: chunking must not depend on them
		if _, err := w.Write(p[:k]); err != nil {
			return err
		}
		p = p[k:]
	}
	return nil
}

func layerBytes() []byte {
	b := make([]byte, 3*layerChunkSize+12345)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// TestReadLayerOverHTTP: a layer streams from the node intact over the
// wire, the node token is required for the stream as for unary calls, and
// an unknown layer is NotFound.
func TestReadLayerOverHTTP(t *testing.T) {
	n := &layerNode{data: layerBytes()}
	path, h := NewCubeletHandler(n, nil, "secret")
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()

	cl := NewClient(srv.Client(), srv.URL, "secret")
	rc, err := cl.ReadLayer(ctx, "sha256:known")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, n.data) {
		t.Fatalf("layer over the wire: %d bytes (want %d), equal=%v, err=%v", len(got), len(n.data), bytes.Equal(got, n.data), err)
	}

	rc, err = cl.ReadLayer(ctx, "sha256:unknown")
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown layer: %v, want NotFound", err)
	}

	bad := NewClient(srv.Client(), srv.URL, "wrong")
	rc, err = bad.ReadLayer(ctx, "sha256:known")
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v, want Unauthenticated", err)
	}
}

// TestReadLayerInProcess: the in-process client (all-in-one) reads layers
// from the node agent directly, and a node without layers is
// Unimplemented.
func TestReadLayerInProcess(t *testing.T) {
	n := &layerNode{data: layerBytes()}
	rc, err := NewInProcessClient(n, nil).ReadLayer(context.Background(), "sha256:known")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, n.data) {
		t.Fatalf("in-process layer: %d bytes, err=%v", len(got), err)
	}
	_, err = NewInProcessClient(&commitNode{}, nil).ReadLayer(context.Background(), "sha256:known")
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("node without layers: %v, want NotImplemented", err)
	}
}

package nodeapi

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
)

// LayerReader is implemented by node agents that can ship the layers of
// their templates (template.WriteLayerTar). It is apart from Cubelet so
// that agents without it still serve the rest of the protocol; ReadLayer
// then answers Unimplemented.
type LayerReader interface {
	// ReadLayer writes the tar of the layer with that digest to w, or
	// fails with errdefs.ErrNotFound before writing anything.
	ReadLayer(ctx context.Context, digest string, w io.Writer) error
}

// layerChunkSize is the size of the messages a layer is streamed in: well
// under connect's default message limits, large enough that framing costs
// nothing.
const layerChunkSize = 1 << 20

// ReadLayer returns the tar stream of a template layer the node holds. The
// caller reads it to the end (a truncated or failed stream ends in an
// error, never in a short EOF) and closes it.
func (c *Client) ReadLayer(ctx context.Context, digest string) (io.ReadCloser, error) {
	if c.local != nil {
		return c.readLocalLayer(ctx, digest)
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.rpc.ReadLayer(ctx, connect.NewRequest(&nodev1.LayerRef{Digest: digest}))
	if err != nil {
		cancel()
		return nil, FromConnect(err)
	}
	return &layerStream{stream: stream, cancel: cancel}, nil
}

// readLocalLayer serves an in-process client: the generated client
// interface cannot be met by a handler for streams, so the node agent is
// called directly through a pipe.
func (c *Client) readLocalLayer(ctx context.Context, digest string) (io.ReadCloser, error) {
	lr, ok := c.local.(LayerReader)
	if !ok {
		return nil, fmt.Errorf("this node cannot ship template layers: %w", errdefs.ErrNotImplemented)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(lr.ReadLayer(ctx, digest, pw)) }()
	return pr, nil
}

// layerStream reads a ReadLayer stream as bytes.
type layerStream struct {
	stream *connect.ServerStreamForClient[nodev1.LayerChunk]
	cancel context.CancelFunc
	buf    []byte
}

func (s *layerStream) Read(p []byte) (int, error) {
	for len(s.buf) == 0 {
		if !s.stream.Receive() {
			if err := s.stream.Err(); err != nil {
				return 0, FromConnect(err)
			}
			return 0, io.EOF
		}
		s.buf = s.stream.Msg().GetData()
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

func (s *layerStream) Close() error {
	s.cancel()
	return s.stream.Close()
}

func (s *cubeletServer) ReadLayer(ctx context.Context, req *connect.Request[nodev1.LayerRef], out *connect.ServerStream[nodev1.LayerChunk]) error {
	lr, ok := s.c.(LayerReader)
	if !ok {
		return ToConnect(fmt.Errorf("this node cannot ship template layers: %w", errdefs.ErrNotImplemented))
	}
	w := &chunkWriter{out: out}
	if err := lr.ReadLayer(ctx, req.Msg.GetDigest(), w); err != nil {
		return ToConnect(err)
	}
	return ToConnect(w.flush())
}

// chunkWriter sends what is written to it as LayerChunk messages of
// layerChunkSize bytes.
type chunkWriter struct {
	out *connect.ServerStream[nodev1.LayerChunk]
	buf []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		room := layerChunkSize - len(w.buf)
		take := min(room, len(p))
		w.buf = append(w.buf, p[:take]...)
		p = p[take:]
		if len(w.buf) == layerChunkSize {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.out.Send(&nodev1.LayerChunk{Data: w.buf})
	w.buf = w.buf[:0]
	return err
}

// inProcessRPC is the CubeletService client of an in-process Client: the
// handler itself for unary calls. Streams go around it (readLocalLayer).
type inProcessRPC struct{ *cubeletServer }

func (inProcessRPC) ReadLayer(context.Context, *connect.Request[nodev1.LayerRef]) (*connect.ServerStreamForClient[nodev1.LayerChunk], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("in-process clients read layers directly"))
}

package templatedist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
)

// metaTimeout bounds the metadata request; the rootfs stream is bounded
// only by the caller's context, since its size is the template's.
const metaTimeout = 30 * time.Second

// Fetcher pulls templates from the server (see Handler) into a node's
// registry. The zero value with BaseURLs set is usable.
type Fetcher struct {
	// BaseURLs are the server replicas, tried in order while they are
	// unreachable or answer 5xx.
	BaseURLs []string
	// APIKey is sent as X-API-Key.
	APIKey string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP *http.Client
	// Logger gets one line per layered fetch; nil means slog.Default().
	Logger *slog.Logger
}

// Fetch registers the server's template called name in reg and returns it.
// The rootfs is streamed straight into reg.ImportStream, which keeps it
// only when its digest (and the digest of its xattrs, when the server
// publishes one) equals the one the server published (else the error wraps
// errdefs.ErrConflict); the template's sizes and defaults are registered
// with it. A layered template (Meta.Layers) is made instead from the
// node's template holding the longest prefix of its layers (after fetching
// Meta.BaseName when the node holds none) plus the missing layers, each
// downloaded from LayerPrefix and checked against its digest; a template
// published with one layer (held by the server as a layer only) is that
// layer extracted into an empty rootfs; a server
// without layer routes, or layers it cannot serve, get the full stream as
// before. Concurrent fetches of one name, in this
// process or others sharing reg, import once: the others wait for the
// registry's name lock, find the template registered and return it without
// downloading. A template the server lacks gives errdefs.ErrNotFound.
func (f *Fetcher) Fetch(ctx context.Context, reg *template.Registry, name string) (template.Template, error) {
	if err := template.ValidateName(name); err != nil {
		return template.Template{}, err
	}
	if len(f.BaseURLs) == 0 {
		return template.Template{}, fmt.Errorf("fetch template %q: no server URL configured: %w", name, errdefs.ErrFailedPrecondition)
	}
	var errs []error
	for _, base := range f.BaseURLs {
		t, err := f.fetchFrom(ctx, reg, strings.TrimRight(base, "/"), name, true)
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) || ctx.Err() != nil {
			return t, err
		}
		errs = append(errs, err)
	}
	return template.Template{}, errors.Join(errs...)
}

// fetchFrom fetches name from the replica at base; layered says whether a
// layered template may be fetched by layers (not for the bottom template
// of one, which is flat: a flat template published with its one layer
// is fetched as that layer, whatever layered says).
func (f *Fetcher) fetchFrom(ctx context.Context, reg *template.Registry, base, name string, layered bool) (template.Template, error) {
	ref, prefix, err := f.meta(ctx, base, name)
	if err != nil {
		return template.Template{}, fmt.Errorf("fetch template %q from %s: %w", name, base, err)
	}
	if err := template.ValidateDigest(ref.Digest); err != nil {
		return template.Template{}, fmt.Errorf("fetch template %q from %s: %w", name, base, err)
	}
	if t, err := reg.Get(ctx, name); err == nil {
		return sameDigest(t, ref.Digest)
	}
	if len(ref.Layers) == 1 || layered && len(ref.Layers) > 1 {
		t, err := f.fetchLayers(ctx, reg, base, ref)
		if !errors.Is(err, errNoLayers) {
			return t, err
		}
		// The server cannot ship it by layers: the whole rootfs, which a
		// server holding it only as layers refuses (409, explained).
		t, serr := f.fetchStream(ctx, reg, base, prefix, ref)
		if serr != nil {
			return template.Template{}, fmt.Errorf("%w (and by layers: %v)", serr, err)
		}
		return t, nil
	}
	return f.fetchStream(ctx, reg, base, prefix, ref)
}

// fetchStream imports the template of ref from its full rootfs stream.
func (f *Fetcher) fetchStream(ctx context.Context, reg *template.Registry, base, prefix string, ref Meta) (template.Template, error) {
	name := ref.Name
	body := &lazyBody{open: func() (io.ReadCloser, error) { return f.openTar(ctx, base, prefix, name, ref.Digest) }}
	defer body.Close()
	t, err := reg.ImportStream(ctx, name, body, template.Published{
		Digest: ref.Digest, XattrDigest: ref.XattrDigest, Defaults: ref.Defaults,
		CPUCount: ref.CPUCount, MemoryMB: ref.MemoryMB, DiskSizeMB: ref.DiskSizeMB,
	})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		// Another fetch won the race and registered it meanwhile.
		if t, err = reg.Get(ctx, name); err != nil {
			return template.Template{}, err
		}
		return sameDigest(t, ref.Digest)
	}
	if err != nil {
		return template.Template{}, fmt.Errorf("fetch template %q from %s: %w", name, base, err)
	}
	return t, nil
}

// sameDigest returns t when it is the server's version of the template.
func sameDigest(t template.Template, want string) (template.Template, error) {
	if t.Digest != want {
		return template.Template{}, fmt.Errorf("template %q on this node has digest %s, the server's has %s: remove the node's copy (cube template rm) to fetch the server's: %w",
			t.Name, t.Digest, want, errdefs.ErrConflict)
	}
	return t, nil
}

// meta reads the template's metadata, from Prefix, else (a server of the
// previous version answers 404 there) from legacyPrefix; it returns the
// prefix that answered, for the download.
func (f *Fetcher) meta(ctx context.Context, base, name string) (Meta, string, error) {
	ctx, cancel := context.WithTimeout(ctx, metaTimeout)
	defer cancel()
	prefix := Prefix
	res, err := f.get(ctx, base+prefix+url.PathEscape(name))
	if errors.Is(err, errdefs.ErrNotFound) {
		prefix = legacyPrefix
		if lres, lerr := f.get(ctx, base+prefix+url.PathEscape(name)); lerr == nil {
			res, err = lres, nil
		}
	}
	if err != nil {
		return Meta{}, "", err
	}
	defer res.Body.Close()
	var ref Meta
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&ref); err != nil {
		return Meta{}, "", fmt.Errorf("decode template metadata: %w: %w", errdefs.ErrUnavailable, err)
	}
	if ref.Name != name {
		return Meta{}, "", fmt.Errorf("server answered with template %q: %w", ref.Name, errdefs.ErrFailedPrecondition)
	}
	return ref, prefix, nil
}

// openTar starts the rootfs download and checks it is the version whose
// metadata was read.
func (f *Fetcher) openTar(ctx context.Context, base, prefix, name, want string) (io.ReadCloser, error) {
	res, err := f.get(ctx, base+prefix+url.PathEscape(name)+"/rootfs.tar")
	if err != nil {
		return nil, err
	}
	if got := res.Header.Get(DigestHeader); got != want {
		res.Body.Close()
		return nil, fmt.Errorf("server's template %q changed during the fetch (digest %s, then %q); retry: %w", name, want, got, errdefs.ErrConflict)
	}
	return &transportBody{res.Body}, nil
}

// get sends an authenticated GET and maps a non-200 answer to an error kind.
func (f *Fetcher) get(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("request %s: %w: %w", u, errdefs.ErrInvalidArgument, err)
	}
	if f.APIKey != "" {
		req.Header.Set("X-API-Key", f.APIKey)
	}
	hc := f.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w: %w", u, errdefs.ErrUnavailable, err)
	}
	if res.StatusCode == http.StatusOK {
		return res, nil
	}
	defer res.Body.Close()
	var ae struct{ Message string }
	b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &ae) == nil && ae.Message != "" {
		msg = ae.Message
	}
	return nil, fmt.Errorf("GET %s: %s: %s: %w", u, res.Status, msg, statusKind(res.StatusCode))
}

// statusKind maps an HTTP status from the server to an error kind.
func statusKind(code int) error {
	switch {
	case code == http.StatusNotFound:
		return errdefs.ErrNotFound
	case code == http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case code == http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case code == http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case code == http.StatusTooManyRequests || code >= 500:
		return errdefs.ErrUnavailable
	default:
		return errdefs.ErrFailedPrecondition
	}
}

// lazyBody opens the download on the first Read, so an import that finds
// the template already registered downloads nothing.
type lazyBody struct {
	open func() (io.ReadCloser, error)
	rc   io.ReadCloser
	err  error
}

func (b *lazyBody) Read(p []byte) (int, error) {
	if b.rc == nil && b.err == nil {
		b.rc, b.err = b.open()
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.rc.Read(p)
}

func (b *lazyBody) Close() error {
	if b.rc == nil {
		return nil
	}
	return b.rc.Close()
}

// transportBody marks read failures of the stream (a cut connection) as
// errdefs.ErrUnavailable.
type transportBody struct{ io.ReadCloser }

func (b *transportBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("read template stream: %w: %w", errdefs.ErrUnavailable, err)
	}
	return n, err
}

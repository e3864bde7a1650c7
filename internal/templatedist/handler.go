// Package templatedist ships templates from the server's registry to nodes
// that lack them: an HTTP handler on the server serves each template's
// metadata and an uncompressed tar stream of its rootfs, labelled with the
// template's sha256 digest; a Fetcher on the node streams that tar into the
// node's registry, which registers it only when the imported rootfs has the
// same digest. A layered template is shipped by layers instead: the node
// downloads only the layers it lacks (GET LayerPrefix{digest}), each
// checked against its digest, and stacks them on the template it holds.
// Source tells the scheduler which templates the server can ship.
package templatedist

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/errdefs/errhttp"
	"github.com/cube-dev/cube/internal/template"
)

// DigestHeader carries the template digest on a rootfs.tar response.
const DigestHeader = "X-Cube-Template-Digest"

// KeyVerifier checks an API key (the control-plane store implements it).
type KeyVerifier interface {
	// VerifyKey returns the key's id, or an error wrapping
	// errdefs.ErrUnauthenticated.
	VerifyKey(ctx context.Context, plaintext string) (string, error)
}

// Prefix is where the server serves templates to nodes. It is Cube's own:
// the E2B API owns /templates/... (template builds, list, delete).
const Prefix = "/cube/v1/templates/"

// legacyPrefix is where servers before the E2B template API served them;
// a server still answers there for nodes of that version (only the two
// GET routes below, which the E2B API does not use), and a node falls
// back to it when a server of that version answers 404 on Prefix.
const legacyPrefix = "/templates/"

// Handler serves the templates in reg to holders of an API key (X-API-Key
// or Authorization: Bearer):
//
//	GET /cube/v1/templates/{name}            JSON Meta: {name, digest, cpuCount, memoryMB,
//	                                         diskSizeMB, defaults?, xattrDigest?, layers?, baseName?}
//	GET /cube/v1/templates/{name}/rootfs.tar the rootfs as a tar stream (see template.WriteTar:
//	                                         owners, modes, hard links, xattrs...), with header
//	                                         X-Cube-Template-Digest
//	GET /cube/v1/layers/{digest}             one layer as a tar stream (template.WriteLayerTar),
//	                                         with header X-Cube-Layer-Digest
//
// and the two template routes under /templates/ for nodes of the previous
// version. Mount it with Mount. The registry is read on every request, so
// templates registered on the server after start are served at once. It is
// NewHandler without a layer store.
func Handler(reg *template.Registry, keys KeyVerifier) http.Handler {
	return NewHandler(reg, keys, nil)
}

// NewHandler is Handler that also serves the templates and layers of the
// control-plane store (layers may be nil): a template the registry lacks
// is answered from its store record (metadata with its layers; its
// rootfs.tar is refused with 409, since the server holds only its layers),
// and a layer is read from the store first, else from the registry.
func NewHandler(reg *template.Registry, keys KeyVerifier, layers LayerStore) http.Handler {
	mux := http.NewServeMux()
	for _, prefix := range []string{Prefix, legacyPrefix} {
		serveTemplates(mux, prefix, reg, layers)
	}
	serveLayers(mux, reg, layers)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if v, ok := cutPrefixFold(r.Header.Get("Authorization"), "Bearer "); ok {
				key = strings.TrimSpace(v)
			}
		}
		if key == "" {
			writeErr(w, fmt.Errorf("missing API key: send it in the X-API-Key header: %w", errdefs.ErrUnauthenticated))
			return
		}
		if _, err := keys.VerifyKey(r.Context(), key); err != nil {
			writeErr(w, err)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Mount registers h (a Handler) on mux for exactly its routes, so every
// other path under /templates/ stays the E2B API's.
func Mount(mux *http.ServeMux, h http.Handler) {
	for _, prefix := range []string{Prefix, legacyPrefix} {
		mux.Handle("GET "+prefix+"{name}", h)
		mux.Handle("GET "+prefix+"{name}/rootfs.tar", h)
	}
	mux.Handle("GET "+LayerPrefix+"{digest}", h)
}

func serveTemplates(mux *http.ServeMux, prefix string, reg *template.Registry, layers LayerStore) {
	mux.HandleFunc("GET "+prefix+"{name}", func(w http.ResponseWriter, r *http.Request) {
		var m Meta
		t, err := reg.Get(r.Context(), r.PathValue("name"))
		switch {
		case err == nil:
			m, err = metaOf(r.Context(), reg, t)
		case errors.Is(err, errdefs.ErrNotFound) && layers != nil:
			var rerr error
			if m, rerr = recordMeta(r.Context(), layers, r.PathValue("name")); !errors.Is(rerr, errdefs.ErrNotFound) {
				err = rerr
			}
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(m)
	})
	mux.HandleFunc("GET "+prefix+"{name}/rootfs.tar", func(w http.ResponseWriter, r *http.Request) {
		t, err := reg.Get(r.Context(), r.PathValue("name"))
		if errors.Is(err, errdefs.ErrNotFound) && layers != nil {
			err = layersOnly(r.Context(), layers, r.PathValue("name"), err)
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set(DigestHeader, t.Digest)
		if r.Method == http.MethodHead {
			return
		}
		bw := bufio.NewWriterSize(w, 256<<10)
		if err := template.WriteTar(r.Context(), t.RootfsPath, bw); err != nil {
			// The status is sent; cut the connection so the client sees a
			// truncated stream instead of a short one that looks complete.
			panic(http.ErrAbortHandler)
		}
		if err := bw.Flush(); err != nil {
			panic(http.ErrAbortHandler)
		}
	})
}

// Meta is the metadata the server publishes for a template. Fields after
// TemplateRef were added later: they are omitted when empty, and a node
// reading an older server's answer gets none (no defaults, xattrs
// unchecked), as an older node ignores them.
type Meta struct {
	cluster.TemplateRef
	// Defaults are the template's sandbox defaults (env, workdir, user,
	// entrypoint, cmd), registered with the node's copy.
	Defaults *template.Defaults `json:"defaults,omitempty"`
	// XattrDigest is template.XattrDigest of the rootfs: the node checks
	// the xattrs it imported against it (Digest leaves them out).
	XattrDigest string `json:"xattrDigest,omitempty"`
	// Layers is the template's stack of layers, bottom first, for a
	// layered template (empty for a flat one): a node holding a template
	// whose layers are a prefix of these fetches only the rest, from
	// LayerPrefix.
	Layers []template.LayerRef `json:"layers,omitempty"`
	// BaseName names the flat template whose digest is Layers[0], for a
	// node that holds none of the layers; "" when the server knows none.
	BaseName string `json:"baseName,omitempty"`
}

// metaOf computes t's Meta. The xattr digest walks the tree: it is asked
// once per node that lacks the template, before a download of all of it.
func metaOf(ctx context.Context, reg *template.Registry, t template.Template) (Meta, error) {
	xd, err := template.XattrDigest(ctx, t.RootfsPath)
	if err != nil {
		return Meta{}, fmt.Errorf("template %q: %w", t.Name, err)
	}
	m := Meta{TemplateRef: wireRef(refOf(t)), Defaults: t.Defaults, XattrDigest: xd}
	if len(t.Layers) > 1 {
		m.Layers = t.Layers
		m.BaseName, err = flatNamed(ctx, reg, t.Layers[0].Digest)
		if err != nil {
			return Meta{}, fmt.Errorf("template %q: %w", t.Name, err)
		}
	}
	return m, nil
}

// refOf is the part of a template's metadata the scheduler uses: with its
// layer digests when it is layered.
func refOf(t template.Template) cluster.TemplateRef {
	ref := cluster.TemplateRef{Name: t.Name, Digest: t.Digest, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB}
	if len(t.Layers) > 1 {
		for _, l := range t.Layers {
			ref.Layers = append(ref.Layers, l.Digest)
		}
	}
	return ref
}

// wireRef is ref as Meta embeds it: the layers travel as Meta.Layers and
// Meta.BaseName (with sizes), not twice.
func wireRef(ref cluster.TemplateRef) cluster.TemplateRef {
	ref.Layers, ref.Base = nil, ""
	return ref
}

func writeErr(w http.ResponseWriter, err error) { errhttp.Write(w, err) }

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// parseMetadataQuery decodes the SDK's triple-encoded `metadata` filter. The
// value has already been URL-decoded once by net/http; it is a form string
// (`k=v&k=v`, decoded a second time by ParseQuery) whose keys and values were
// encodeURIComponent'ed by the SDK (decoded a third time here). A key given
// twice keeps its first value.
func parseMetadataQuery(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	form, err := url.ParseQuery(v)
	if err != nil {
		return nil, fmt.Errorf("%w: metadata filter %q is not a k=v&k=v string: %w", errdefs.ErrInvalidArgument, v, err)
	}
	out := make(map[string]string, len(form))
	for k, vs := range form {
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, fmt.Errorf("%w: metadata filter key %q: %w", errdefs.ErrInvalidArgument, k, err)
		}
		val, err := url.QueryUnescape(vs[0])
		if err != nil {
			return nil, fmt.Errorf("%w: metadata filter value of %q: %w", errdefs.ErrInvalidArgument, key, err)
		}
		if key == "" {
			return nil, fmt.Errorf("%w: metadata filter has an empty key", errdefs.ErrInvalidArgument)
		}
		if _, dup := out[key]; !dup {
			out[key] = val
		}
	}
	return out, nil
}

// parseListQuery reads GET /v2/sandboxes query parameters.
func parseListQuery(q url.Values) (store.ListFilter, error) {
	var f store.ListFilter
	meta, err := parseMetadataQuery(q.Get("metadata"))
	if err != nil {
		return f, err
	}
	f.Metadata = meta
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			st = strings.TrimSpace(st)
			if st == "" {
				continue
			}
			if !store.State(st).Valid() {
				return f, fmt.Errorf("%w: state %q is not running or paused", errdefs.ErrInvalidArgument, st)
			}
			f.States = append(f.States, store.State(st))
		}
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, fmt.Errorf("%w: startedAfter %q is not an RFC 3339 time", errdefs.ErrInvalidArgument, v)
		}
		f.StartedAfter = t
	}
	// A template's name also finds the sandboxes of its tags, which report
	// it as their templateID (wire.go templateID).
	f.Template, f.AnyTag = q.Get("template"), true
	switch o := strings.ToLower(q.Get("order")); o {
	case "":
	case "asc", "desc":
		f.Order = store.Order(o)
	default:
		return f, fmt.Errorf("%w: order %q is not asc or desc", errdefs.ErrInvalidArgument, o)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > store.MaxLimit {
			return f, fmt.Errorf("%w: limit must be an integer between 1 and %d", errdefs.ErrInvalidArgument, store.MaxLimit)
		}
		f.Limit = n
	}
	f.NextToken = q.Get("nextToken")
	return f, nil
}

// listSandboxes serves GET /v2/sandboxes: a JSON array of ListedSandbox and
// X-Next-Token when there are more pages.
func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	f, err := parseListQuery(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.m.List(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]listedJSON, 0, len(page.Sandboxes))
	for _, sb := range page.Sandboxes {
		out = append(out, toListed(sb))
	}
	w.Header().Set("Access-Control-Expose-Headers", "X-Next-Token")
	if page.NextToken != "" {
		w.Header().Set("X-Next-Token", page.NextToken)
	}
	writeJSON(w, http.StatusOK, out)
}

// listSandboxesV1 serves the deprecated GET /sandboxes: every matching
// sandbox (only the metadata filter applies) in one JSON array.
func (s *server) listSandboxesV1(w http.ResponseWriter, r *http.Request) {
	meta, err := parseMetadataQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := []listedJSON{}
	f := store.ListFilter{Metadata: meta, Limit: store.MaxLimit}
	for {
		page, err := s.m.List(r.Context(), f)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		for _, sb := range page.Sandboxes {
			out = append(out, toListed(sb))
		}
		if page.NextToken == "" {
			break
		}
		f.NextToken = page.NextToken
	}
	writeJSON(w, http.StatusOK, out)
}

package cluster

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/errdefs/errhttp"
)

// DrainRequest is the body of POST /nodes/{id}/drain.
type DrainRequest struct {
	Policy          DrainPolicy `json:"policy"`
	GraceSeconds    *int        `json:"graceSeconds,omitempty"`
	DeadlineSeconds int         `json:"deadlineSeconds,omitempty"`
}

// NewAdminHandler serves the node administration API used by `cube node`
// (mounted by MountAdmin under AdminPrefix, and at the root for clients
// older than it):
//
//	GET    /nodes                    list (JSON array of NodeStatus)
//	GET    /nodes/{id}
//	POST   /nodes/{id}/isolate
//	POST   /nodes/{id}/uncordon
//	POST   /nodes/{id}/drain         body DrainRequest
//	DELETE /nodes/{id}[?force=true]
//
// Every route needs an API key (X-API-Key or Authorization: Bearer).
// Reads first merge the stored node records and recount the sandboxes
// (Registry.Sync), so every replica reports the same operator state, drain
// progress and sandbox counts.
func NewAdminHandler(r *Registry, keys KeyVerifier) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, req *http.Request) {
		if err := r.Sync(req.Context()); err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, r.Nodes())
	})
	mux.HandleFunc("GET /nodes/{id}", func(w http.ResponseWriter, req *http.Request) {
		if err := r.Sync(req.Context()); err != nil {
			writeErr(w, err)
			return
		}
		st, err := r.Node(req.PathValue("id"))
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, st)
	})
	action := func(fn func(req *http.Request, id string) error) http.HandlerFunc {
		return func(w http.ResponseWriter, req *http.Request) {
			id := req.PathValue("id")
			if err := fn(req, id); err != nil {
				writeErr(w, err)
				return
			}
			st, err := r.Node(id)
			if err != nil {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			writeJSON(w, http.StatusOK, st)
		}
	}
	mux.HandleFunc("POST /nodes/{id}/isolate", action(func(req *http.Request, id string) error { return r.Isolate(req.Context(), id) }))
	mux.HandleFunc("POST /nodes/{id}/uncordon", action(func(req *http.Request, id string) error { return r.Uncordon(req.Context(), id) }))
	mux.HandleFunc("POST /nodes/{id}/drain", action(func(req *http.Request, id string) error {
		var body DrainRequest
		dec := json.NewDecoder(http.MaxBytesReader(nil, req.Body, 1<<16))
		if err := dec.Decode(&body); err != nil {
			return errors.Join(errdefs.ErrInvalidArgument, err)
		}
		if body.Policy == "" {
			body.Policy = DrainKill
		}
		grace := DefaultDrainGrace
		if body.GraceSeconds != nil {
			grace = time.Duration(*body.GraceSeconds) * time.Second
		}
		return r.Drain(req.Context(), id, Drain{Policy: body.Policy, Grace: grace, Deadline: time.Duration(body.DeadlineSeconds) * time.Second})
	}))
	mux.HandleFunc("DELETE /nodes/{id}", func(w http.ResponseWriter, req *http.Request) {
		if err := r.Delete(req.Context(), req.PathValue("id"), req.URL.Query().Get("force") == "true"); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set(AdminHeader, "v1")
		key := req.Header.Get("X-API-Key")
		if key == "" {
			key, _ = strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		}
		if _, err := keys.VerifyKey(req.Context(), key); key == "" || err != nil {
			writeErr(w, errdefs.ErrUnauthenticated)
			return
		}
		mux.ServeHTTP(w, req)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) { errhttp.Write(w, err) }

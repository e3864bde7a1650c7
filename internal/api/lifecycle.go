package api

import (
	"fmt"
	"net/http"

	"github.com/cube-dev/cube/internal/errdefs"
)

// setTimeout serves POST /sandboxes/{sandboxID}/timeout {"timeout": s}.
func (s *server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if !s.decodeRequest(w, r, &body) {
		return
	}
	if body.Timeout == nil {
		s.writeError(w, r, fmt.Errorf("%w: timeout (seconds) is required", errdefs.ErrInvalidArgument))
		return
	}
	if err := s.m.SetTimeout(r.Context(), r.PathValue("sandboxID"), *secondsPtr(body.Timeout)); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh serves POST /sandboxes/{sandboxID}/refreshes {"duration"?: s}.
func (s *server) refresh(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if !s.decodeRequest(w, r, &body) {
		return
	}
	if err := s.m.Refresh(r.Context(), r.PathValue("sandboxID"), secondsPtr(body.Duration)); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect serves POST /v2/sandboxes/{sandboxID}/connect {"timeout"?: s}:
// 200 if it was running, 201 if it was resumed.
func (s *server) connect(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if !s.decodeRequest(w, r, &body) {
		return
	}
	sb, resumed, err := s.m.Connect(r.Context(), r.PathValue("sandboxID"), secondsPtr(body.Timeout))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.toSandbox(sb))
}

// resume serves the deprecated POST /sandboxes/{sandboxID}/resume: 201 when
// resumed, 409 when it was already running.
func (s *server) resume(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if !s.decodeRequest(w, r, &body) {
		return
	}
	id := r.PathValue("sandboxID")
	sb, err := s.m.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sb.State != "paused" {
		s.writeError(w, r, fmt.Errorf("resume sandbox %s: %w: it is already running", id, errdefs.ErrConflict))
		return
	}
	sb, _, err = s.m.Connect(r.Context(), id, secondsPtr(body.Timeout))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.toSandbox(sb))
}

// pause serves POST /sandboxes/{sandboxID}/pause: 204, 404, or 409 when
// already paused. The optional {"memory": bool} is accepted and ignored
// (the freezer keeps memory).
func (s *server) pause(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if !s.decodeRequest(w, r, &body) {
		return
	}
	if err := s.m.Pause(r.Context(), r.PathValue("sandboxID")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/httplog"
	"github.com/cube-dev/cube/internal/master"
)

// newSandboxBody is E2B's NewSandboxV2 (and the deprecated NewSandbox).
// Fields the client did not set are absent; unknown fields are ignored.
type newSandboxBody struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *master.Network         `json:"network"`
	VolumeMounts        []json.RawMessage       `json:"volumeMounts"`
}

// secondsPtr converts optional wire seconds to a duration without overflow
// (out-of-range values stay out of range so the master rejects them).
func secondsPtr(s *int64) *time.Duration {
	if s == nil {
		return nil
	}
	v := *s
	limit := int64(math.MaxInt64 / int64(time.Second))
	v = min(max(v, -1), limit)
	d := time.Duration(v) * time.Second
	return &d
}

// decodeCreate turns a create body into master parameters. Every failure
// wraps errdefs.ErrInvalidArgument or errdefs.ErrNotImplemented.
func decodeCreate(body []byte) (master.CreateParams, error) {
	var b newSandboxBody
	if len(body) == 0 {
		return master.CreateParams{}, fmt.Errorf("%w: request body is required, e.g. {\"templateID\":\"base\"}", errdefs.ErrInvalidArgument)
	}
	if err := decodeJSON(body, &b); err != nil {
		return master.CreateParams{}, err
	}
	if b.TemplateID == "" {
		return master.CreateParams{}, fmt.Errorf("%w: templateID is required", errdefs.ErrInvalidArgument)
	}
	if len(b.VolumeMounts) > 0 {
		return master.CreateParams{}, fmt.Errorf("%w: volumeMounts are not supported by this Cube server", errdefs.ErrNotImplemented)
	}
	p := master.CreateParams{
		TemplateID: b.TemplateID, Timeout: secondsPtr(b.Timeout), Metadata: b.Metadata, EnvVars: b.EnvVars,
		AllowInternetAccess: b.AllowInternetAccess, Network: b.Network,
	}
	if b.AutoPause != nil {
		p.AutoPause = *b.AutoPause
	}
	if b.AutoPauseMemory != nil {
		p.AutoPauseMemory = *b.AutoPauseMemory
	}
	if b.AutoResume != nil {
		p.AutoResume = b.AutoResume.Enabled
	}
	return p, nil
}

// createSandbox serves POST /v2/sandboxes and the deprecated POST /sandboxes.
func (s *server) createSandbox(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if errors.Is(err, errBodyTooLarge) {
		writeErrorMessage(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := decodeCreate(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.builds != nil {
		// name:tag (and a name whose default tag moved) names the template
		// holding a build (templatebuild/tags.go); the sandbox records the
		// name it was asked for as its alias.
		tpl, err := s.builds.ResolveTemplate(r.Context(), p.TemplateID)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if tpl != p.TemplateID {
			p.Alias, p.TemplateID = p.TemplateID, tpl
		}
	}
	sb, err := s.m.Create(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	httplog.SetSandbox(r.Context(), sb.ID)
	writeJSON(w, http.StatusCreated, s.toSandbox(sb))
}

package api

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/templatebuild"
)

// buildRoutes is the template build part of server (embedded there).
type buildRoutes struct {
	builds *templatebuild.Service
}

// WithTemplateBuilds serves E2B's template build API (the SDK's Template
// builder and the e2b CLI's template commands) with svc. Without it those
// routes answer 404.
func WithTemplateBuilds(svc *templatebuild.Service) Option {
	return func(s *server) { s.builds = svc }
}

// templateRoutes registers the template routes when a build service is
// configured. The upload route carries no API key (the SDK sends none on
// the PUT): the signed token in its URL authorizes it.
func (s *server) templateRoutes(mux *http.ServeMux, auth func(http.HandlerFunc) http.Handler) {
	if s.builds == nil {
		return
	}
	mux.Handle("POST /v3/templates", auth(s.requestBuild))
	mux.Handle("GET /templates/{templateID}/files/{hash}", auth(s.fileLink))
	mux.HandleFunc("PUT "+templatebuild.UploadPath+"{hash}", s.putFile)
	mux.Handle("POST /v2/templates/{templateID}/builds/{buildID}", auth(s.startBuild))
	mux.Handle("GET /templates/{templateID}/builds/{buildID}/status", auth(s.buildStatus))
	mux.Handle("GET /templates", auth(s.listTemplates))
	mux.Handle("DELETE /templates/{templateID}", auth(s.deleteTemplate))
	mux.Handle("POST /templates/tags", auth(s.assignTags))   // tags.go
	mux.Handle("DELETE /templates/tags", auth(s.removeTags)) // tags.go
	// GET /templates/aliases/{alias} and GET /templates/{templateID}/tags
	// overlap (/templates/aliases/tags), which ServeMux refuses to register
	// as two patterns: one pattern, dispatched here.
	mux.Handle("GET /templates/{templateID}/{sub}", auth(s.templateAliasOrTags))
}

func (s *server) templateAliasOrTags(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.PathValue("templateID") == "aliases":
		s.templateAlias(w, r, r.PathValue("sub"))
	case r.PathValue("sub") == "tags":
		s.templateTags(w, r, r.PathValue("templateID"))
	default:
		writeErrorMessage(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	}
}

func (s *server) requestBuild(w http.ResponseWriter, r *http.Request) {
	var req buildRequestJSON
	if !s.decodeRequest(w, r, &req) {
		return
	}
	if req.Name == "" {
		req.Name = req.Alias // the deprecated spelling
	}
	got, err := s.builds.RequestBuild(r.Context(), templatebuild.BuildRequest{
		Name: req.Name, Tags: req.Tags, CPUCount: req.CPUCount, MemoryMB: req.MemoryMB})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	names := []string{got.TemplateID}
	writeJSON(w, http.StatusAccepted, buildRequestedJSON{TemplateID: got.TemplateID, BuildID: got.BuildID,
		Names: names, Aliases: names, Public: false, Tags: got.Tags})
}

func (s *server) fileLink(w http.ResponseWriter, r *http.Request) {
	link, err := s.builds.FileLink(r.Context(), r.PathValue("templateID"), r.PathValue("hash"), baseURL(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, fileLinkJSON{Present: link.Present, URL: link.URL})
}

// baseURL is the server's URL as the client reached it: the scheme
// (https behind TLS or when a proxy says X-Forwarded-Proto: https) and
// the Host header (or X-Forwarded-Host). A wrong value from a client only
// misdirects that client's own upload.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	host := r.Host
	if fh := r.Header.Get("X-Forwarded-Host"); fh != "" {
		host = strings.TrimSpace(strings.Split(fh, ",")[0])
	}
	return scheme + "://" + host
}

func (s *server) putFile(w http.ResponseWriter, r *http.Request) {
	limit := s.builds.MaxUploadBytes()
	if r.ContentLength > limit {
		writeErrorMessage(w, http.StatusRequestEntityTooLarge, "the archive is larger than "+strconv.FormatInt(limit, 10)+" bytes")
		return
	}
	q := r.URL.Query()
	err := s.builds.PutFile(r.Context(), r.PathValue("hash"), q.Get("token"), q.Get("expires"), r.Body)
	if errors.Is(err, templatebuild.ErrTooLarge) {
		writeErrorMessage(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

func (s *server) startBuild(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if errors.Is(err, errBodyTooLarge) {
		writeErrorMessage(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	var spec templatebuild.BuildSpec
	if err == nil {
		spec, err = templatebuild.DecodeSpec(body)
	}
	if err == nil {
		err = s.builds.StartBuild(r.Context(), r.PathValue("templateID"), r.PathValue("buildID"), spec)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The SDK ignores the body; Content-Length: 0 keeps openapi-fetch from
	// parsing one.
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

func (s *server) buildStatus(w http.ResponseWriter, r *http.Request) {
	offset := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeErrorMessage(w, http.StatusBadRequest, "logsOffset must be a non-negative integer, got "+strconv.Quote(v))
			return
		}
		offset = n
	}
	info, err := s.builds.Status(r.Context(), r.PathValue("templateID"), r.PathValue("buildID"), offset)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *server) listTemplates(w http.ResponseWriter, r *http.Request) {
	list, err := s.builds.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]templateJSON, 0, len(list))
	for _, t := range list {
		names := []string{t.TemplateID}
		out = append(out, templateJSON{TemplateID: t.TemplateID, BuildID: t.BuildID, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB,
			DiskSizeMB: t.DiskSizeMB, EnvdVersion: t.EnvdVersion, Public: false, Aliases: names, Names: names,
			CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, LastSpawnedAt: nil, SpawnCount: 0, BuildCount: t.BuildCount,
			BuildStatus: t.BuildStatus, CreatedBy: nil})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.builds.Delete(r.Context(), r.PathValue("templateID")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) templateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	t, err := s.builds.Resolve(r.Context(), alias)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, aliasJSON{TemplateID: t.Name, Public: false})
}

func (s *server) templateTags(w http.ResponseWriter, r *http.Request, templateID string) {
	tags, err := s.builds.Tags(r.Context(), templateID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]tagJSON, 0, len(tags))
	for _, t := range tags {
		out = append(out, tagJSON{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// buildRequestJSON is TemplateBuildRequestV3 (alias and teamID are not
// sent by SDK 2.51.0; alias is honoured when name is absent).
type buildRequestJSON struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

// buildRequestedJSON is TemplateRequestResponseV3.
type buildRequestedJSON struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Aliases    []string `json:"aliases"`
	Public     bool     `json:"public"`
	Tags       []string `json:"tags"`
}

// fileLinkJSON is TemplateBuildFileUpload.
type fileLinkJSON struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// templateJSON is E2B's Template (GET /templates), every required field.
type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	EnvdVersion   string     `json:"envdVersion"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int        `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	BuildStatus   string     `json:"buildStatus"`
	CreatedBy     *struct{}  `json:"createdBy"`
}

// aliasJSON is TemplateAliasResponse.
type aliasJSON struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// tagJSON is one TemplateTag.
type tagJSON struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

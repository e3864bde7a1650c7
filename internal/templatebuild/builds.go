package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// BuildRequest is POST /v3/templates.
type BuildRequest struct {
	Name     string
	Tags     []string
	CPUCount int // 0 = the parent template's
	MemoryMB int // 0 = the parent template's
}

// RequestedBuild answers RequestBuild.
type RequestedBuild struct {
	TemplateID string
	BuildID    string
	Tags       []string
}

// RequestBuild records a new build, waiting for StartBuild. The template id
// is the template name, so the same name always gets the same id.
func (s *Service) RequestBuild(ctx context.Context, req BuildRequest) (RequestedBuild, error) {
	name, tags, err := ParseBuildName(req.Name, req.Tags)
	if err != nil {
		return RequestedBuild{}, err
	}
	if req.CPUCount < 0 || req.MemoryMB < 0 {
		return RequestedBuild{}, fmt.Errorf("%w: cpuCount and memoryMB must not be negative", errdefs.ErrInvalidArgument)
	}
	b := store.TemplateBuild{ID: newUUID(), Template: name, Status: store.BuildWaiting, CPUCount: req.CPUCount, MemoryMB: req.MemoryMB}
	if err := s.cfg.Store.CreateTemplateBuild(ctx, b); err != nil {
		return RequestedBuild{}, err
	}
	if err := s.cfg.Store.SetTemplateBuildTags(ctx, b.ID, tags); err != nil { // tags.go
		return RequestedBuild{}, err
	}
	return RequestedBuild{TemplateID: name, BuildID: b.ID, Tags: tags}, nil
}

// known reports whether templateID names a template or has builds.
func (s *Service) known(ctx context.Context, templateID string) error {
	name, err := ParseName(templateID)
	if err != nil {
		return fmt.Errorf("template %q: %w", templateID, errdefs.ErrNotFound)
	}
	if _, err := s.cfg.Templates.Get(ctx, name); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	builds, err := s.cfg.Store.ListTemplateBuilds(ctx, name)
	if err != nil {
		return err
	}
	if len(builds) == 0 {
		return fmt.Errorf("template %q: %w", templateID, errdefs.ErrNotFound)
	}
	return nil
}

// FileLink answers GET /templates/{templateID}/files/{hash}.
type FileLink struct {
	Present bool
	// URL is an absolute, self-authorizing PUT URL (no API key needed).
	// It is given even when Present, so that copy(..., {forceUpload:true})
	// can upload again.
	URL string
}

// FileLink returns whether the files of hash are stored and where to PUT
// them. base is the server's external URL as the client reached it
// (Config.PublicURL wins when set).
func (s *Service) FileLink(ctx context.Context, templateID, hash, base string) (FileLink, error) {
	if !ValidHash(hash) {
		return FileLink{}, fmt.Errorf("%w: files hash %q must be 64 lowercase hex characters", errdefs.ErrInvalidArgument, hash)
	}
	if err := s.known(ctx, templateID); err != nil {
		return FileLink{}, err
	}
	if s.cfg.PublicURL != "" {
		base = s.cfg.PublicURL
	}
	exp := s.now().Add(s.cfg.UploadURLTTL).Unix()
	q := url.Values{"expires": {strconv.FormatInt(exp, 10)}, "token": {uploadToken(s.cfg.Secret, hash, exp)}}
	u := strings.TrimSuffix(base, "/") + UploadPath + hash + "?" + q.Encode()
	present, err := s.files.used(ctx, hash)
	if err != nil {
		return FileLink{}, err
	}
	return FileLink{Present: present, URL: u}, nil
}

// UploadPath is the path prefix of upload URLs; the hash follows.
const UploadPath = "/cube/v1/template-files/"

// PutFile stores an uploaded COPY archive after checking the URL's token.
func (s *Service) PutFile(ctx context.Context, hash, token, expires string, body io.Reader) error {
	if !ValidHash(hash) {
		return fmt.Errorf("%w: files hash %q must be 64 lowercase hex characters", errdefs.ErrInvalidArgument, hash)
	}
	if err := verifyUploadToken(s.cfg.Secret, hash, token, expires, s.now()); err != nil {
		return err
	}
	body, counted := s.cfg.Metrics.upload(body)
	err := s.files.put(ctx, hash, body)
	counted(err)
	return err
}

// MaxUploadBytes is the size bound of one upload.
func (s *Service) MaxUploadBytes() int64 { return s.cfg.MaxUploadBytes }

// StartBuild validates spec and runs the build in the background.
func (s *Service) StartBuild(ctx context.Context, templateID, buildID string, spec BuildSpec) error {
	b, err := s.build(ctx, templateID, buildID)
	if err != nil {
		return err
	}
	parent, err := ParseParent(spec)
	if err != nil {
		return err
	}
	if parent, err = s.resolveParent(ctx, parent); err != nil { // tags.go
		return err
	}
	if err := s.checkParent(ctx, parent, b.Template); err != nil {
		return err
	}
	if _, err := s.commitTarget(ctx, b.ID, parent.Template); err != nil { // refuses rebuilding a template in use
		return err
	}
	for i, st := range spec.Steps {
		if st.Type != StepCopy {
			continue
		}
		if present, err := s.files.used(ctx, st.FilesHash); err != nil {
			return err
		} else if !present {
			return fmt.Errorf("%w: step %d (COPY %s): its files (hash %s) were never uploaded; upload them through GET /templates/%s/files/%s first",
				errdefs.ErrInvalidArgument, i+1, st.Args[0], st.FilesHash, templateID, st.FilesHash)
		}
	}
	if err := s.cfg.Store.StartTemplateBuild(ctx, buildID, s.owner); err != nil {
		return err
	}
	s.wg.Add(1)
	s.gcMu.RLock() // held by the build until it ends: no collection meanwhile
	go func() {
		defer s.wg.Done()
		defer s.gcMu.RUnlock()
		s.run(b, parent, spec)
	}()
	return nil
}

// checkParent refuses, before the build starts, a parent the build cannot
// start from: a missing template, the template itself, or an image when
// this server imports none (Config.Images unset). An image is only read
// by the build.
func (s *Service) checkParent(ctx context.Context, parent Parent, template string) error {
	if parent.Image != "" {
		if s.cfg.Images == nil {
			return fmt.Errorf("%w: fromImage %q: this Cube server does not build from container images; "+
				"make the image a template with `cube template create NAME --from-image %s`, then build on it with fromTemplate(NAME)",
				errdefs.ErrInvalidArgument, parent.Image, parent.Image)
		}
		return nil
	}
	if parent.Template == template {
		return fmt.Errorf("%w: template %q cannot be built from itself; build it from another template", errdefs.ErrInvalidArgument, template)
	}
	if _, err := s.cfg.Templates.Get(ctx, parent.Template); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("%w: the template to build from, %q, does not exist; list them with GET /templates", errdefs.ErrInvalidArgument, parent.Template)
		}
		return err
	}
	return nil
}

// build returns the build record buildID of templateID.
func (s *Service) build(ctx context.Context, templateID, buildID string) (store.TemplateBuild, error) {
	b, err := s.cfg.Store.GetTemplateBuild(ctx, buildID)
	if err != nil {
		return store.TemplateBuild{}, err
	}
	if name, err := ParseName(templateID); err != nil || name != b.Template {
		return store.TemplateBuild{}, fmt.Errorf("build %s of template %q: %w", buildID, templateID, errdefs.ErrNotFound)
	}
	return b, nil
}

// LogEntry is one build log line (TemplateBuildLogEntry).
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// BuildInfo is TemplateBuildInfo, the answer of the status route.
type BuildInfo struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	LogEntries []LogEntry `json:"logEntries"`
	Logs       []string   `json:"logs"`
	Reason     *Reason    `json:"reason,omitempty"`
}

// Status returns a build's status and its log entries from offset on (at
// most MaxLogEntries). Every "error" answer carries the reason.
func (s *Service) Status(ctx context.Context, templateID, buildID string, offset int) (BuildInfo, error) {
	if offset < 0 {
		return BuildInfo{}, fmt.Errorf("%w: logsOffset must not be negative", errdefs.ErrInvalidArgument)
	}
	b, err := s.build(ctx, templateID, buildID)
	if err != nil {
		return BuildInfo{}, err
	}
	logs, err := s.cfg.Store.TemplateBuildLogs(ctx, buildID, offset, MaxLogEntries)
	if err != nil {
		return BuildInfo{}, err
	}
	info := BuildInfo{TemplateID: templateID, BuildID: buildID, Status: string(b.Status), LogEntries: make([]LogEntry, 0, len(logs)), Logs: []string{}}
	for _, e := range logs {
		info.LogEntries = append(info.LogEntries, LogEntry{Timestamp: e.Time, Level: e.Level, Message: e.Message, Step: e.Step})
	}
	if b.Status == store.BuildError {
		info.Reason = decodeReason(b.Reason)
		if info.Reason == nil {
			info.Reason = &Reason{Message: "the build failed"}
		}
	}
	return info, nil
}

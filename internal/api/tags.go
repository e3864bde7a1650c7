package api

import (
	"net/http"
)

// Template tags (internal/templatebuild/tags.go), as SDK 2.51.0's
// Template.assignTags and Template.removeTags call them.

// assignTagsJSON is AssignTemplateTagsRequest.
type assignTagsJSON struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// assignedTagsJSON is AssignedTemplateTags.
type assignedTagsJSON struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

// removeTagsJSON is DeleteTemplateTagsRequest.
type removeTagsJSON struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

func (s *server) assignTags(w http.ResponseWriter, r *http.Request) {
	var req assignTagsJSON
	if !s.decodeRequest(w, r, &req) {
		return
	}
	got, err := s.builds.AssignTags(r.Context(), req.Target, req.Tags)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, assignedTagsJSON{BuildID: got.BuildID, Tags: got.Tags})
}

// removeTags serves DELETE /templates/tags, which also names a template
// called "tags": without a body it deletes that one.
func (s *server) removeTags(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 {
		r.SetPathValue("templateID", "tags")
		s.deleteTemplate(w, r)
		return
	}
	var req removeTagsJSON
	if !s.decodeRequest(w, r, &req) {
		return
	}
	if err := s.builds.RemoveTags(r.Context(), req.Name, req.Tags); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

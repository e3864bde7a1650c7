package templatebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cube-dev/cube/internal/errdefs"
)

// BaseTemplate is Cube's default template, which E2B's default image
// (e2bdev/base) maps to.
const BaseTemplate = "base"

// baseImage is E2B's default image, as go-containerregistry names it.
const baseImage = "index.docker.io/e2bdev/base"

// Images makes container images templates for builds `fromImage`;
// internal/roles implements it over the server's template registry.
type Images interface {
	// Import makes image ref (as the SDK sent it) a template, or finds the
	// one an earlier import of the same image made, and returns its name.
	// auth, when set, are credentials for ref's registry; without them the
	// pull is anonymous. progress gets lines for the build log. Errors name
	// the image and wrap errdefs kinds.
	Import(ctx context.Context, ref string, auth *RegistryAuth, progress io.Writer) (template string, err error)
}

// RegistryAuth is the basic credentials of fromImageRegistry
// {"type":"registry"}.
type RegistryAuth struct {
	Username string
	Password string
}

// Parent is where a build starts: a Cube template, or a container image the
// build imports as a template first.
type Parent struct {
	Template string // a Cube template; "" when Image is set
	Image    string // a container image reference (valid, as sent)
	Auth     *RegistryAuth
}

func (p Parent) String() string {
	if p.Image != "" {
		return "image " + p.Image
	}
	return p.Template
}

// ParseParent decides where the build of spec starts: fromTemplate's
// template; `base` for E2B's default image (no from*, fromBaseImage(),
// e2bdev/base[:latest]); else fromImage's image with fromImageRegistry's
// credentials. It reads no registry: a malformed reference or unsupported
// credentials fail here, a missing image fails the build.
func ParseParent(spec BuildSpec) (Parent, error) {
	switch {
	case spec.FromTemplate != "" && spec.FromImage != "":
		return Parent{}, fmt.Errorf("%w: give fromTemplate or fromImage, not both", errdefs.ErrInvalidArgument)
	case spec.FromTemplate != "":
		// name:tag stays whole; StartBuild resolves it (tags.go).
		n, tag, err := ParseRef(spec.FromTemplate)
		if err == nil && tag != DefaultTag {
			n += ":" + tag
		}
		return Parent{Template: n}, err
	}
	img := strings.TrimSpace(spec.FromImage)
	if img == "" {
		return Parent{Template: BaseTemplate}, nil
	}
	ref, err := name.ParseReference(img)
	if err != nil {
		return Parent{}, fmt.Errorf("%w: fromImage %q is not a valid image reference (like ubuntu:22.04, ghcr.io/org/app:1 or repo@sha256:...): %v",
			errdefs.ErrInvalidArgument, img, err)
	}
	if ref.Context().Name() == baseImage && ref.Identifier() == "latest" {
		return Parent{Template: BaseTemplate}, nil
	}
	auth, err := parseRegistryAuth(spec.FromImageRegistry)
	if err != nil {
		return Parent{}, err
	}
	return Parent{Image: img, Auth: auth}, nil
}

// parseRegistryAuth decodes fromImageRegistry: nil without it, basic
// credentials for {"type":"registry"}; the cloud registries' types are
// refused.
func parseRegistryAuth(raw json.RawMessage) (*RegistryAuth, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var r struct {
		Type     string `json:"type"`
		Username string `json:"username"`
		Password string `json:"password"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%w: malformed fromImageRegistry: %v", errdefs.ErrInvalidArgument, err)
	}
	switch r.Type {
	case "registry":
		if r.Username == "" || r.Password == "" {
			return nil, fmt.Errorf("%w: fromImageRegistry of type registry needs a username and a password", errdefs.ErrInvalidArgument)
		}
		return &RegistryAuth{Username: r.Username, Password: r.Password}, nil
	case "aws", "gcp":
		return nil, fmt.Errorf("%w: fromImageRegistry of type %q (from%sRegistry) is not supported by Cube; "+
			"give the registry's username and password with fromImage(image, {username, password}) instead",
			errdefs.ErrInvalidArgument, r.Type, strings.ToUpper(r.Type))
	default:
		return nil, fmt.Errorf("%w: fromImageRegistry type %q is unknown; Cube supports \"registry\" (username and password)",
			errdefs.ErrInvalidArgument, r.Type)
	}
}

// importImage imports the build's image through Config.Images (logging
// its progress under step "base") and returns the template to build on.
func (r *runner) importImage(ctx context.Context) (string, error) {
	img := r.from.Image
	r.log.infof(stepBase, "pulling image %s", img)
	w := &logWriter{lines: lineSplitter{emit: func(s string) {
		r.log.add(levelInfo, stepBase, strings.TrimPrefix(s, "cube: "))
	}}}
	if r.images == nil {
		return "", failf(stepBase, "image %s: this build cannot import images; make it a template with `cube template create NAME --from-image REF` first", img)
	}
	tpl, err := r.images.Import(ctx, img, r.from.Auth, w)
	w.lines.flush()
	if err != nil {
		return "", failf(stepBase, "image %s: %v", img, err)
	}
	r.log.infof(stepBase, "image %s is template %s", img, tpl)
	return tpl, nil
}

// logWriter is an io.Writer of lines.
type logWriter struct{ lines lineSplitter }

func (w *logWriter) Write(p []byte) (int, error) {
	w.lines.write(p)
	return len(p), nil
}

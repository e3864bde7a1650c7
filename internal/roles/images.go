package roles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// registryImages imports the container images of template builds
// fromImage into the server's template registry, one template per image
// (templatebuild.ImageTemplate of its manifest digest), which builds then
// start from like any server template; in cluster mode nodes fetch it from
// the server as any other. With shared set (cluster mode), the template is
// also stored in the control-plane store as one layer plus a record, so
// every server replica ships it to nodes, and an image another replica
// imported is reused from there instead of pulled again.
type registryImages struct {
	reg *template.Registry
	// insecure lists the registries (HOST[:PORT], lowercase) the operator
	// allows over plain HTTP; every other registry is pulled over HTTPS.
	insecure []string
	// shared is the store the replicas share; nil: this server only.
	shared imageStore
	log    *slog.Logger
}

func (m *registryImages) logger() *slog.Logger {
	if m.log != nil {
		return m.log
	}
	return slog.Default()
}

var _ templatebuild.Images = (*registryImages)(nil)

// newRegistryImages checks the --insecure-registry values.
func newRegistryImages(reg *template.Registry, insecure []string) (*registryImages, error) {
	m := &registryImages{reg: reg}
	for _, h := range insecure {
		h = strings.ToLower(strings.TrimSpace(h))
		if err := ValidateInsecureRegistry(h); err != nil {
			return nil, fmt.Errorf("insecure registry: %w", err)
		}
		m.insecure = append(m.insecure, h)
	}
	return m, nil
}

// ValidateInsecureRegistry checks an --insecure-registry value: a registry
// host with an optional port, as image references name it.
func ValidateInsecureRegistry(h string) error {
	if h == "" || strings.ContainsAny(h, "/@ ") {
		return fmt.Errorf("%q is not a registry: give HOST or HOST:PORT (like 10.0.0.5:5000), without a scheme or path: %w",
			h, errdefs.ErrInvalidArgument)
	}
	if _, err := name.NewRegistry(h, name.StrictValidation); err != nil {
		return fmt.Errorf("%q is not a registry: %v: %w", h, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// plainHTTP reports whether registry (ref.Context().RegistryStr()) is
// listed: HOST:PORT exactly, or HOST for every port of HOST.
func (m *registryImages) plainHTTP(registry string) bool {
	registry = strings.ToLower(registry)
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	for _, e := range m.insecure {
		if e == registry || strings.Trim(e, "[]") == host {
			return true
		}
	}
	return false
}

// Import resolves ref to its manifest digest (for the host's platform),
// reuses the template an earlier import of that digest made (on this
// replica, else recorded in the shared store by another), or imports the
// image pinned to the digest under its name (and shares it).
func (m *registryImages) Import(ctx context.Context, ref string, auth *templatebuild.RegistryAuth, progress io.Writer) (string, error) {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	registry := parsed.Context().RegistryStr()
	src := template.ImageSource{Ref: ref, InsecureRegistry: m.plainHTTP(registry), Keychain: keychain{registry: registry, auth: auth}}
	res, err := template.ResolveImage(ctx, src)
	if err != nil {
		return "", pullError(ref, registry, auth, err)
	}
	fmt.Fprintf(progress, "resolved %s to %s\n", ref, res.Pinned())
	tpl := templatebuild.ImageTemplate(res.Digest)
	if t, ok, err := m.imported(ctx, tpl, res); ok || err != nil {
		if ok {
			fmt.Fprintf(progress, "image %s already imported as template %s\n", res.Digest, tpl)
			// An import of an earlier version, or one whose sharing failed.
			m.share(ctx, t, progress)
		}
		return tpl, err
	}
	if ok, err := m.recorded(ctx, tpl); ok || err != nil {
		if ok {
			fmt.Fprintf(progress, "image %s already imported as template %s (by another server replica)\n", res.Digest, tpl)
		}
		return tpl, err
	}
	src.Ref, src.Progress = res.Pinned(), progress
	t, err := m.reg.ImportImage(ctx, tpl, src)
	if err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) { // another build imported it meanwhile
			if _, ok, err := m.imported(ctx, tpl, res); ok || err != nil {
				return tpl, err // its importer shares it
			}
		}
		return "", pullError(ref, registry, auth, err)
	}
	m.share(ctx, t, progress)
	return tpl, nil
}

// imported returns template tpl when it exists and holds image res; a
// template of that name holding something else is a conflict.
func (m *registryImages) imported(ctx context.Context, tpl string, res template.ResolvedImage) (template.Template, bool, error) {
	t, err := m.reg.Get(ctx, tpl)
	if errors.Is(err, errdefs.ErrNotFound) {
		return template.Template{}, false, nil
	}
	if err != nil {
		return template.Template{}, false, err
	}
	if !strings.HasPrefix(t.Source, "image:") || !strings.HasSuffix(t.Source, "@"+res.Digest) {
		return template.Template{}, false, fmt.Errorf("template %s exists but does not hold image %s (its source: %q); remove it with `cube template rm %s`: %w",
			tpl, res.Pinned(), t.Source, tpl, errdefs.ErrConflict)
	}
	return t, true, nil
}

// pullError rewrites the registry failures whose advice is for `cube
// template create` (docker login, the CLI's flag) for a build's user.
func pullError(ref, registry string, auth *templatebuild.RegistryAuth, err error) error {
	switch {
	case errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, errdefs.ErrPermissionDenied):
		kind := errdefs.ErrUnauthenticated
		if errors.Is(err, errdefs.ErrPermissionDenied) {
			kind = errdefs.ErrPermissionDenied
		}
		if auth == nil {
			return fmt.Errorf("pull %s: registry %s refused an anonymous pull; give its credentials with fromImage(image, {username, password}): %w",
				ref, registry, kind)
		}
		return fmt.Errorf("pull %s: registry %s refused the credentials of user %q: %w", ref, registry, auth.Username, kind)
	case errors.Is(err, errdefs.ErrFailedPrecondition) && strings.Contains(err.Error(), "plain HTTP"):
		return fmt.Errorf("pull %s: registry %s is not reachable over HTTPS, and the Cube server pulls over plain HTTP only from "+
			"the registries its operator lists with --insecure-registry HOST[:PORT] (cube up, cube server): %w", ref, registry, errdefs.ErrFailedPrecondition)
	}
	return err
}

// keychain gives auth for registry and nothing (anonymous) elsewhere: a
// build's credentials are for its image's registry only, and the server's
// own docker credentials are never lent to API callers.
type keychain struct {
	registry string
	auth     *templatebuild.RegistryAuth
}

func (k keychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if k.auth == nil || r.RegistryStr() != k.registry {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{Username: k.auth.Username, Password: k.auth.Password}), nil
}

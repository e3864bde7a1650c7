package templatebuild

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
)

// DefaultTag is E2B's name for "no tag": `name` means `name:default`.
const DefaultTag = "default"

// CachePrefix starts the names of the intermediate templates of the step
// cache; they are hidden from listings.
const CachePrefix = "buildcache-"

// ImagePrefix starts the names of the templates builds import container
// images into (ImageTemplate); like the cache's, they are hidden from the
// E2B listing.
const ImagePrefix = "image-"

// BuildPrefix starts the names of the templates that hold the results
// of builds a tag points at when the template's own name cannot
// (BuildTemplate, tags.go); hidden from listings like the cache's.
const BuildPrefix = "build-"

// maxTagLen bounds a tag (E2B sets none; a bound keeps names printable).
const maxTagLen = 128

var (
	tagRE      = regexp.MustCompile(`^[a-z0-9_.-]+$`)
	uuidRE     = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	imageTplRE = regexp.MustCompile(`^` + ImagePrefix + `[0-9a-f]{16}$`)
	buildTplRE = regexp.MustCompile(`^` + BuildPrefix + `[0-9a-f]{32}$`)
)

// BuildTemplate is the name of the template holding the result of build
// buildID (a UUID) when it cannot be the template's own name.
func BuildTemplate(buildID string) string {
	return BuildPrefix + strings.ReplaceAll(strings.ToLower(buildID), "-", "")
}

// IsBuildTemplate reports whether name has the form of BuildTemplate's.
func IsBuildTemplate(name string) bool { return buildTplRE.MatchString(name) }

// ImageTemplate is the name of the template a build imports the image with
// manifest digest into: the same image (by content, whatever the tag or
// repository that named it) always maps to the same name, so it is
// imported once and reused.
func ImageTemplate(digest string) string {
	sum := sha256.Sum256([]byte(digest))
	return ImagePrefix + hex.EncodeToString(sum[:])[:16]
}

// IsImageTemplate reports whether name has the form of ImageTemplate's.
func IsImageTemplate(name string) bool { return imageTplRE.MatchString(name) }

// ParseName parses an E2B template name `alias[:tag]` (trimmed and
// lowercased, as E2B does) into the Cube template name, checking the tag's
// form and dropping it. Cube templates are named, so the E2B templateID is
// the name itself. Use ParseRef where the tag matters.
func ParseName(s string) (string, error) {
	name, _, err := ParseRef(s)
	return name, err
}

// ParseRef parses `alias[:tag]` into the template name and the tag
// (DefaultTag when there is none).
func ParseRef(s string) (name, tag string, err error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return "", "", fmt.Errorf("%w: template name is empty", errdefs.ErrInvalidArgument)
	}
	name, rawTag, hasTag := strings.Cut(s, ":")
	tag = DefaultTag
	if hasTag {
		if tag, err = normTag(rawTag); err != nil {
			return "", "", err
		}
	}
	if strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%w: template name %q: namespaced names (team/name) are not supported by Cube; use a plain name", errdefs.ErrInvalidArgument, name)
	}
	if err := template.ValidateName(name); err != nil {
		return "", "", fmt.Errorf("%w: template name %q must be 1-63 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or digit",
			errdefs.ErrInvalidArgument, name)
	}
	return name, tag, nil
}

// normTag trims and lowercases a tag and checks its form (E2B's: a-z,
// 0-9, '-', '_', '.'; not a UUID, which would read as a build id).
func normTag(tag string) (string, error) {
	t := strings.ToLower(strings.TrimSpace(tag))
	if !tagRE.MatchString(t) || len(t) > maxTagLen {
		return "", fmt.Errorf("%w: tag %q must match %s (at most %d characters)", errdefs.ErrInvalidArgument, tag, tagRE, maxTagLen)
	}
	if uuidRE.MatchString(t) {
		return "", fmt.Errorf("%w: tag %q: a tag cannot be a UUID", errdefs.ErrInvalidArgument, tag)
	}
	return t, nil
}

// normTags normalizes tags, dropping duplicates, in their first order.
func normTags(tags []string) ([]string, error) {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		n, err := normTag(t)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// ParseBuildName parses the name and extra tags of POST /v3/templates into
// the template name and the tags the build gets once it is ready: the
// name's tag and the extra ones, or DefaultTag when neither gives one.
func ParseBuildName(name string, tags []string) (string, []string, error) {
	n, err := ParseName(name)
	if err != nil {
		return "", nil, err
	}
	if strings.HasPrefix(n, CachePrefix) {
		return "", nil, fmt.Errorf("%w: template names starting with %q are reserved for Cube's build cache", errdefs.ErrInvalidArgument, CachePrefix)
	}
	if IsImageTemplate(n) {
		return "", nil, fmt.Errorf("%w: template name %q has the form %s<16 hex digits>, reserved for images imported by builds; choose another name",
			errdefs.ErrInvalidArgument, n, ImagePrefix)
	}
	if IsBuildTemplate(n) {
		return "", nil, fmt.Errorf("%w: template name %q has the form %s<32 hex digits>, reserved for the results of tagged builds; choose another name",
			errdefs.ErrInvalidArgument, n, BuildPrefix)
	}
	var all []string
	if _, tag, hasTag := strings.Cut(strings.TrimSpace(name), ":"); hasTag {
		all = append(all, tag)
	}
	out, err := normTags(append(all, tags...))
	if err != nil {
		return "", nil, err
	}
	if len(out) == 0 {
		out = []string{DefaultTag}
	}
	return n, out, nil
}

// newUUID returns a random (version 4) UUID, the shape of E2B build ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

package interp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// KernelSpec is a Jupyter kernelspec (kernel.json,
// https://jupyter-client.readthedocs.io/en/stable/kernels.html#kernel-specs):
// how to start a kernel for one language.
type KernelSpec struct {
	Name          string            `json:"-"` // the directory name, e.g. python3
	Argv          []string          `json:"argv"`
	DisplayName   string            `json:"display_name"`
	Language      string            `json:"language"`
	InterruptMode string            `json:"interrupt_mode"` // "signal" (default) or "message"
	Env           map[string]string `json:"env"`
}

// DefaultKernelDirs are where Jupyter installs kernelspecs system-wide;
// the Debian package python3-ipykernel puts python3 in the first.
var DefaultKernelDirs = []string{"/usr/share/jupyter/kernels", "/usr/local/share/jupyter/kernels"}

// Kernels maps a language (normalised, see NormalizeLanguage) to the spec
// that runs it.
type Kernels map[string]KernelSpec

// FindKernels reads the kernelspecs under dirs. The first spec found for a
// language wins (dirs and spec names are read in order). Unreadable or
// malformed specs are skipped: one broken kernel does not hide the others.
func FindKernels(dirs []string) (Kernels, error) {
	out := Kernels{}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read kernelspecs: %w", err)
		}
		for _, e := range entries {
			spec, err := readKernelSpec(filepath.Join(dir, e.Name(), "kernel.json"))
			if err != nil {
				continue
			}
			spec.Name = e.Name()
			lang := NormalizeLanguage(spec.Language)
			if _, dup := out[lang]; !dup {
				out[lang] = spec
			}
		}
	}
	return out, nil
}

func readKernelSpec(path string) (KernelSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return KernelSpec{}, err
	}
	var spec KernelSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return KernelSpec{}, fmt.Errorf("kernelspec %s: %w", path, err)
	}
	if len(spec.Argv) == 0 || spec.Language == "" {
		return KernelSpec{}, fmt.Errorf("kernelspec %s: argv or language missing", path)
	}
	return spec, nil
}

// Languages lists the languages that have a kernel, sorted.
func (k Kernels) Languages() []string {
	out := make([]string, 0, len(k))
	for l := range k {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// Lookup returns the spec for language (any spelling NormalizeLanguage
// accepts); a language without a kernel is ErrInvalidArgument naming the
// languages this sandbox has.
func (k Kernels) Lookup(language string) (KernelSpec, error) {
	lang := NormalizeLanguage(language)
	kernelLang := lang
	if lang == "typescript" { // runs on the JavaScript kernel, as upstream
		kernelLang = "javascript"
	}
	if spec, ok := k[kernelLang]; ok {
		return spec, nil
	}
	return KernelSpec{}, fmt.Errorf("language %q is not available in this sandbox; available: %s: %w",
		lang, strings.Join(k.Languages(), ", "), errdefs.ErrInvalidArgument)
}

// NormalizeLanguage is the client's language name as contexts report it:
// lower case, python when empty, js and ts spelled out.
func NormalizeLanguage(language string) string {
	l := strings.ToLower(strings.TrimSpace(language))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	case "python3":
		return "python"
	}
	return l
}

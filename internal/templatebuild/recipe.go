package templatebuild

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cube-dev/cube/internal/template"
)

// interpRecipe is code-interpreter-v1's definition: what
//
//	Template().fromTemplate('base')
//	  .runCmd('apt-get update && ... install python3-munkres && ... install python3-ipykernel ... && apt-get clean ...', {user: 'root'})
//
// sends (aptInstall's command line, twice in one step so that one layer
// is committed). python3-munkres goes first so that apt takes it for the
// alternative it is in: python3-fonttools (matplotlib) depends on
// "python3-scipy | python3-munkres", and scipy pulls g++ and boost
// through pythran (~300 MB). Recipe appends the step writing the marker.
//
//go:embed recipes/code-interpreter-v1.json
var interpRecipe []byte

// Recipe is a template Cube defines itself as a template build: the same
// steps a user's Template builder sends, run by Executor on a node.
type Recipe struct {
	Name string
	Spec BuildSpec
	// Key is the sha256 (hex) of the spec as Cube's file says it: it
	// names the recipe's version (the marker of a built template records
	// it; caches of the result are keyed on it).
	Key string
}

// InterpRecipe returns the recipe of the built-in template
// code-interpreter-v1: the embedded recipes/code-interpreter-v1.json plus a
// last step writing template.InterpMarker (which asks for the
// code-interpreter server on port 49999) with the recipe's key in it.
func InterpRecipe() Recipe {
	spec, err := DecodeSpec(interpRecipe)
	if err != nil {
		panic(fmt.Sprintf("templatebuild: embedded recipe %s: %v", template.InterpName, err)) // a test decodes it
	}
	key := hashJSON([]any{"cube-recipe-v1", spec})
	marker := "/" + template.InterpMarker
	spec.Steps = append(spec.Steps, Step{Type: StepRun, Args: []string{fmt.Sprintf(
		"mkdir -p %s && printf '%%s\\n' '# Sandboxes of this template run the code-interpreter server (cube-interp) on port 49999.' '%s%s' > %s",
		filepath.Dir(marker), recipeLine, key, marker), "root"}})
	return Recipe{Name: template.InterpName, Spec: spec, Key: key}
}

// recipeLine starts the marker line naming the recipe a template was built from.
const recipeLine = "recipe "

// Built reports whether template t was built from this version of the
// recipe (its marker names the recipe's key).
func (r Recipe) Built(t template.Template) bool {
	b, err := os.ReadFile(filepath.Join(t.RootfsPath, template.InterpMarker))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if strings.TrimSpace(line) == recipeLine+r.Key {
			return true
		}
	}
	return false
}

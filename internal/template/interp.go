package template

import (
	"os"
	"path/filepath"
)

// InterpName is the built-in template of the code interpreter: the name
// `@e2b/code-interpreter` creates sandboxes from. Its definition is a
// template build recipe (templatebuild.InterpRecipe), built on base.
const InterpName = "code-interpreter-v1"

// InterpMarker, a file in a template's rootfs, asks for the code-interpreter
// server (cube-interp, port 49999) in the template's sandboxes. It is part
// of the rootfs, so it travels with the template to every node and is
// covered by its digest; any template can carry it (a build step writing
// it is enough).
const InterpMarker = "etc/cube/code-interpreter"

// HasInterp reports whether the template rootfs asks for the code
// interpreter (InterpMarker).
func HasInterp(rootfs string) bool {
	st, err := os.Stat(filepath.Join(rootfs, InterpMarker))
	return err == nil && st.Mode().IsRegular()
}

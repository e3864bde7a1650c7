package cubelet

import (
	"fmt"
	"slices"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/exepath"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// InterpName is the file name of the code-interpreter server looked for
// next to envd.
const InterpName = "cube-interp"

// sandboxInterpPath is where the code-interpreter server is bound in.
const sandboxInterpPath = "/.cube/interp"

// sandboxEnvdPath is where envd is bound in (sandboxProcs).
const sandboxEnvdPath = "/.cube/envd"

// withInterp adds the code-interpreter server to the processes of a
// sandbox whose template asks for it (template.InterpMarker): its binary is
// bound in read-only like envd's, and it goes in front of envd's argv
// (`cube-interp -- envd ...`), so it starts its server and then execs envd,
// which keeps the pid pid 1 waits for and the ready fd. Other templates get
// args and binds unchanged.
func (c *Cubelet) withInterp(rootfs string, args []string, binds []nsrt.Bind) ([]string, []nsrt.Bind, error) {
	if !template.HasInterp(rootfs) {
		return args, binds, nil
	}
	bin, ok := exepath.Sibling(c.cfg.EnvdPath, InterpName)
	if !ok {
		return nil, nil, fmt.Errorf("the template runs the code interpreter, but %s is not next to envd (%s): build it with `make build`: %w",
			InterpName, c.cfg.EnvdPath, errdefs.ErrFailedPrecondition)
	}
	return interpArgs(args), append(binds, nsrt.Bind{Source: bin, Target: sandboxInterpPath, ReadOnly: true}), nil
}

// interpArgs puts the code-interpreter server in front of envd's argv
// within args (pid 1's argv: envd's alone, or the reaper's around it).
func interpArgs(args []string) []string {
	i := slices.Index(args, sandboxEnvdPath)
	if i < 0 {
		return args
	}
	out := append([]string(nil), args[:i]...)
	out = append(out, sandboxInterpPath, "--")
	return append(out, args[i:]...)
}

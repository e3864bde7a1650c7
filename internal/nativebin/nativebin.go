// Package nativebin builds Cube's C programs, cube-nsexec and cube-reaper
// (cmd/<name>/*.c), as `make build` and the Dockerfiles do: static, with
// gcc. They are C because each runs once or lives on per sandbox, where a
// Go runtime's start and threads cost every create and every sandbox
// (docs/benchmarks.md). Tests and hack/images build them through here.
package nativebin

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
)

// Sources are the C programs: binary name -> source file from the module
// root.
var Sources = map[string]string{
	"cube-nsexec": "cmd/cube-nsexec/nsexec.c",
	"cube-reaper": "cmd/cube-reaper/reaper.c",
}

// Flags are gcc's flags for every program (the Makefile and the
// Dockerfiles spell the same).
var Flags = []string{"-static", "-O2", "-s", "-Wall", "-Werror"}

// Build compiles the program name into out.
func Build(ctx context.Context, name, out string) error {
	src, ok := Sources[name]
	if !ok {
		return fmt.Errorf("nativebin: no C program %q", name)
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	out, err = filepath.Abs(out)
	if err != nil {
		return err
	}
	args := append(slices.Clone(Flags), "-o", out, src)
	cmd := exec.CommandContext(ctx, "gcc", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s (gcc and libc6-dev: make deps): %w\n%s", name, err, b)
	}
	return nil
}

// BuildAll compiles every program of Sources into dir.
func BuildAll(ctx context.Context, dir string) error {
	for name := range Sources {
		if err := Build(ctx, name, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// moduleRoot is the module's directory: this file's (internal/nativebin/)
// grandparent, or go.mod's directory in a -trimpath build.
func moduleRoot(ctx context.Context) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		return filepath.Join(filepath.Dir(file), "..", ".."), nil
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return "", fmt.Errorf("nativebin: find the module root (go env GOMOD): %v", err)
	}
	return filepath.Dir(string(bytes.TrimSpace(out))), nil
}

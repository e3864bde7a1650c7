package nodeops

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/preflight"
	"github.com/cube-dev/cube/internal/version"
)

// PreflightOptions are the checks `cube preflight` and `cube prep` run.
type PreflightOptions struct {
	Config     preflight.Config
	CNIConfDir string // CNI configuration directory of the host
	Format     Format
}

// Preflight gathers the host's facts, checks them and writes the report.
// The error is non-nil (errdefs.ErrFailedPrecondition) when the report did
// not pass.
func Preflight(ctx context.Context, opts PreflightOptions, w io.Writer) (preflight.Report, preflight.Facts, error) {
	facts := preflight.Gather(ctx, preflight.GatherOptions{CNIConfDir: opts.CNIConfDir, ServerURL: opts.Config.ServerURL})
	rep := preflight.Check(opts.Config, facts)
	if opts.Format == JSON {
		if err := writeJSON(w, rep); err != nil {
			return rep, facts, err
		}
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, r := range rep.Results {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Status, r.Name, r.Message)
		}
		tw.Flush()
		fmt.Fprintf(w, "runtime: %s; passed: %t (strict: %t)\n", rep.Runtime, rep.Passed, rep.Strict)
	}
	if !rep.Passed {
		names := make([]string, 0, len(rep.Failed()))
		for _, r := range rep.Failed() {
			names = append(names, r.Name)
		}
		return rep, facts, fmt.Errorf("preflight failed: %s: %w", strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
	}
	return rep, facts, nil
}

// PrepOptions are `cube prep`'s: the checks, then where the node's
// preparation is recorded.
type PrepOptions struct {
	Preflight  PreflightOptions
	Generation int    // cubeNodeBootstrap.prepGeneration, >= 1
	Dir        string // directory of the fingerprints
	RunDir     string // runtime directory to create (netns pins)
	Node       string // node name recorded in the fingerprint
}

// Prep runs the preflight, prepares the node (directories), then writes
// the fingerprint <dir>/<generation>.fingerprint atomically, only when the
// preflight passed. A failed preflight writes <dir>/<generation>.failed
// with the failing checks instead, for the cubelet to report (best effort:
// a write error goes to errOut, the failed checks are the error).
func Prep(ctx context.Context, opts PrepOptions, w, errOut io.Writer) error {
	rep, facts, err := Preflight(ctx, opts.Preflight, w)
	if err != nil {
		if len(rep.Results) > 0 && !rep.Passed {
			f := preflight.NewFailure(opts.Generation, opts.Node, version.Version, rep, time.Now())
			if werr := preflight.WriteFailure(opts.Dir, f); werr != nil {
				fmt.Fprintf(errOut, "cube prep: %v\n", werr)
			}
		}
		return err
	}
	for _, d := range []string{opts.Dir, filepath.Join(opts.RunDir, "netns")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("prep: %w", err)
		}
	}
	fp, err := preflight.NewFingerprint(opts.Generation, opts.Node, version.Version, facts.Kernel, rep, time.Now())
	if err != nil {
		return err
	}
	if err := preflight.WriteFingerprint(opts.Dir, fp); err != nil {
		return err
	}
	if err := preflight.ClearFailure(opts.Dir, opts.Generation); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "node prepared: %s\n", preflight.FingerprintPath(opts.Dir, opts.Generation))
	return err
}

// WaitPrep waits until the node is prepared for the current generation (read
// from genFile: a ConfigMap key) and every file in require exists (e.g. the
// installed envd), polling every `every`; timeout 0 waits for ever.
func WaitPrep(ctx context.Context, w io.Writer, genFile, dir string, require []string, timeout, every time.Duration) error {
	gen, err := preflight.ReadGeneration(genFile)
	if err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	fmt.Fprintf(w, "waiting for %s\n", preflight.FingerprintPath(dir, gen))
	fp, err := preflight.WaitFingerprint(ctx, dir, gen, every)
	if err != nil {
		return err
	}
	for _, p := range require {
		for {
			if _, err := os.Stat(p); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s (is cube-node-installer running on this node?): %w", p, errdefs.ErrUnavailable)
			case <-time.After(every):
			}
		}
	}
	_, err = fmt.Fprintf(w, "node prep generation %d ready (runtime %s, %d warnings)\n", fp.Generation, fp.Runtime, len(fp.Warnings))
	return err
}

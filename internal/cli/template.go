package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/seccomp"
	"github.com/cube-dev/cube/internal/template"
)

func newTemplateCmd() *cobra.Command {
	return group("template", "manage templates: create NAME --from-dir DIR | --from-tar FILE | --from-image REF | --from-oci PATH, ls, inspect, rm",
		newTemplateCreateCmd(), newTemplateLsCmd(), newTemplateInspectCmd(), newTemplateRmCmd())
}

// addDataDirFlag registers --data-dir (env CUBE_DATA_DIR).
func addDataDirFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "data-dir", "/var/lib/cube", "data directory")
	bindEnv(c.Flags(), "data-dir", "CUBE_DATA_DIR")
}

// noStartCmd as --start-cmd: the template starts no command, not even its
// image's ENTRYPOINT and CMD.
const noStartCmd = "none"

func newTemplateCreateCmd() *cobra.Command {
	var dataDir, fromDir, fromTar, fromImage, fromOCI, startCmd, readyCmd string
	var insecure bool
	var syscalls []string
	const usage = "usage: cube template create NAME --from-dir DIR | --from-tar FILE | --from-image REF [--insecure-registry] | --from-oci DIR|TAR [--start-cmd CMD [--ready-cmd CMD]] [--allow-syscall NAME ...]"
	c := &cobra.Command{
		Use:   "create NAME (--from-dir DIR | --from-tar FILE | --from-image REF | --from-oci DIR|TAR)",
		Short: "register a root filesystem (a directory, a .tar/.tar.gz, or a container image) as template NAME",
		Long: `Register template NAME from one source:
  --from-dir DIR     a root filesystem directory
  --from-tar FILE    a root filesystem tarball (.tar or .tar.gz)
  --from-image REF   a container image in a registry (docker config credentials; the host's platform)
  --from-oci PATH    an OCI image layout directory, or a docker save / OCI archive tarball
An image's Env, WorkingDir and USER become the defaults of its sandboxes' processes,
and its ENTRYPOINT and CMD the start command (--start-cmd none: none); see
docs/templates.md. --start-cmd runs a command (sh -c) in every sandbox when it starts;
a create then returns once --ready-cmd exits 0. --allow-syscall lets its sandboxes make
a system call Cube's filter refuses (docs/security.md).`,
		Args: exactArgs(1, usage),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := 0
			for _, s := range []string{fromDir, fromTar, fromImage, fromOCI} {
				if s != "" {
					n++
				}
			}
			if n != 1 || (insecure && fromImage == "") {
				return usageError{usage}
			}
			image := fromImage != "" || fromOCI != ""
			if readyCmd != "" && (startCmd == noStartCmd || startCmd == "" && !image) {
				return usageError{"--ready-cmd waits for a start command: give --start-cmd (an image's ENTRYPOINT and CMD are one)"}
			}
			// Checked first: a template registered with a typo would
			// fail every create.
			if err := seccomp.CheckAllowed(syscalls); err != nil {
				return fmt.Errorf("--allow-syscall: %w", err)
			}
			reg := template.NewRegistry(dataDir)
			var t template.Template
			var err error
			switch {
			case fromDir != "":
				t, err = reg.ImportDir(cmd.Context(), args[0], fromDir)
			case fromTar != "":
				t, err = reg.ImportTar(cmd.Context(), args[0], fromTar)
			case fromImage != "":
				t, err = reg.ImportImage(cmd.Context(), args[0], template.ImageSource{Ref: fromImage, InsecureRegistry: insecure, Progress: cmd.ErrOrStderr()})
			default:
				t, err = reg.ImportImage(cmd.Context(), args[0], template.ImageSource{Path: fromOCI, Progress: cmd.ErrOrStderr()})
			}
			if err != nil {
				return err
			}
			// Start commands run through /bin/sh: an image without one
			// (distroless, scratch) keeps its ENTRYPOINT and CMD unrun.
			_, shErr := os.Lstat(filepath.Join(t.RootfsPath, "bin", "sh"))
			var unrun string
			t, err = reg.UpdateDefaults(cmd.Context(), t.Name, func(d *template.Defaults) {
				d.Syscalls = syscalls
				switch imageCmd := template.ImageStartCmd(d.Entrypoint, d.Cmd); {
				case startCmd == noStartCmd:
				case startCmd != "":
					d.StartCmd = startCmd
				case shErr == nil:
					d.StartCmd = imageCmd
				default:
					unrun = imageCmd
				}
				if d.StartCmd != "" {
					d.ReadyCmd = readyCmd
				}
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "template %s registered (%s)\n", t.Name, t.Digest)
			if d := t.Defaults; d.StartCmd != "" {
				fmt.Fprintf(out, "start command: %s\n", d.StartCmd)
				if d.ReadyCmd != "" {
					fmt.Fprintf(out, "ready command: %s\n", d.ReadyCmd)
				}
			} else if unrun != "" {
				fmt.Fprintf(out, "note: the image has no /bin/sh to run its ENTRYPOINT and CMD (%s) as the start command; sandboxes start none (give --start-cmd)\n", unrun)
			} else if readyCmd != "" {
				fmt.Fprintf(out, "note: the image has no ENTRYPOINT or CMD, so no start command; --ready-cmd is not used\n")
			}
			if len(syscalls) > 0 {
				fmt.Fprintf(out, "its sandboxes may also call: %s\n", strings.Join(syscalls, ", "))
			}
			if d := t.Defaults; d != nil && d.ImageUser != "" && d.User == "" {
				fmt.Fprintf(out, "note: the image's USER %q has no entry in its /etc/passwd; processes run as %q unless a request names a user\n", d.ImageUser, template.UserName)
			}
			return nil
		},
	}
	addDataDirFlag(c, &dataDir)
	c.Flags().StringVar(&fromDir, "from-dir", "", "register a root filesystem directory")
	c.Flags().StringVar(&fromTar, "from-tar", "", "register a root filesystem tarball (.tar or .tar.gz)")
	c.Flags().StringVar(&fromImage, "from-image", "", "register a container image from a registry (e.g. docker.io/library/alpine:3.20)")
	c.Flags().StringVar(&fromOCI, "from-oci", "", "register a container image from an OCI layout directory or a docker save / OCI archive tarball")
	c.Flags().BoolVar(&insecure, "insecure-registry", false, "allow plain HTTP to the --from-image registry")
	c.Flags().StringVar(&startCmd, "start-cmd", "", "run this command (sh -c) in every sandbox when it starts; default for an image: its ENTRYPOINT and CMD; none: no start command")
	c.Flags().StringVar(&readyCmd, "ready-cmd", "", "with a start command: a create returns once this command exits 0 (within 60 s)")
	c.Flags().StringSliceVar(&syscalls, "allow-syscall", nil, "a system call its sandboxes may make beyond Cube's allowlist, unconditionally (repeatable or comma-separated; docs/security.md)")
	return c
}

func newTemplateInspectCmd() *cobra.Command {
	var dataDir string
	c := &cobra.Command{
		Use:   "inspect NAME",
		Short: "print template NAME's metadata as JSON (incl. an image's defaults)",
		Args:  exactArgs(1, "usage: cube template inspect NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := template.NewRegistry(dataDir).Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), t)
		},
	}
	addDataDirFlag(c, &dataDir)
	return c
}

func newTemplateLsCmd() *cobra.Command {
	var dataDir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls",
		Short: "list templates",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := template.NewRegistry(dataDir).List(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return printJSON(out, ts)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCPU\tMEMORY_MB\tDISK_MB\tSOURCE\tCREATED\tDEFAULTS")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", t.Name, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.Source, t.CreatedAt.Format("2006-01-02 15:04"), defaultsSummary(t.Defaults))
			}
			return tw.Flush()
		},
	}
	addDataDirFlag(c, &dataDir)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newTemplateRmCmd() *cobra.Command {
	var dataDir string
	c := &cobra.Command{
		Use:   "rm NAME",
		Short: "remove template NAME",
		Args:  exactArgs(1, "usage: cube template rm NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return template.NewRegistry(dataDir).Delete(cmd.Context(), args[0])
		},
	}
	addDataDirFlag(c, &dataDir)
	return c
}

// defaultsSummary is the DEFAULTS column of `template ls`: what an image
// asks of its processes, or "-".
func defaultsSummary(d *template.Defaults) string {
	if d == nil {
		return "-"
	}
	var parts []string
	if d.User != "" {
		parts = append(parts, "user="+d.User)
	} else if d.ImageUser != "" {
		parts = append(parts, "user="+d.ImageUser+"(unresolved)")
	}
	if d.Workdir != "" {
		parts = append(parts, "workdir="+d.Workdir)
	}
	if len(d.Env) > 0 {
		parts = append(parts, fmt.Sprintf("env=%d", len(d.Env)))
	}
	if len(d.Entrypoint)+len(d.Cmd) > 0 {
		parts = append(parts, "cmd="+strings.Join(append(append([]string(nil), d.Entrypoint...), d.Cmd...), " "))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

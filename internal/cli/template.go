package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/template"
)

func newTemplateCmd() *cobra.Command {
	return group("template", "manage templates: create NAME --from-dir DIR | --from-tar FILE, ls, rm",
		newTemplateCreateCmd(), newTemplateLsCmd(), newTemplateRmCmd())
}

// addDataDirFlag registers --data-dir (env CUBE_DATA_DIR).
func addDataDirFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "data-dir", "/var/lib/cube", "data directory")
	bindEnv(c.Flags(), "data-dir", "CUBE_DATA_DIR")
}

func newTemplateCreateCmd() *cobra.Command {
	var dataDir, fromDir, fromTar string
	const usage = "usage: cube template create NAME --from-dir DIR | --from-tar FILE"
	c := &cobra.Command{
		Use:   "create NAME (--from-dir DIR | --from-tar FILE)",
		Short: "register a root filesystem (a directory or a .tar/.tar.gz) as template NAME",
		Args:  exactArgs(1, usage),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (fromDir == "") == (fromTar == "") {
				return usageError{usage}
			}
			reg := template.NewRegistry(dataDir)
			var t template.Template
			var err error
			if fromDir != "" {
				t, err = reg.ImportDir(cmd.Context(), args[0], fromDir)
			} else {
				t, err = reg.ImportTar(cmd.Context(), args[0], fromTar)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "template %s registered (%s)\n", t.Name, t.Digest)
			return nil
		},
	}
	addDataDirFlag(c, &dataDir)
	c.Flags().StringVar(&fromDir, "from-dir", "", "register a root filesystem directory")
	c.Flags().StringVar(&fromTar, "from-tar", "", "register a root filesystem tarball (.tar or .tar.gz)")
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
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(ts)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCPU\tMEMORY_MB\tDISK_MB\tSOURCE\tCREATED")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", t.Name, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.Source, t.CreatedAt.Format("2006-01-02 15:04"))
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

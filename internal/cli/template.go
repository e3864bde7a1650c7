package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/cube-dev/cube/internal/template"
)

func runTemplate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"usage: cube template create|ls|rm ..."}
	}
	fs := newFlagSet("template "+args[0], stderr)
	dataDir := fs.String("data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory (env CUBE_DATA_DIR)")
	switch args[0] {
	case "create":
		fromDir := fs.String("from-dir", "", "register a root filesystem directory")
		fromTar := fs.String("from-tar", "", "register a root filesystem tarball (.tar or .tar.gz)")
		if err := parseFlags(fs, reorder(fs, args[1:])); err != nil {
			return err
		}
		if fs.NArg() != 1 || (*fromDir == "") == (*fromTar == "") {
			return usageError{"usage: cube template create NAME --from-dir DIR | --from-tar FILE"}
		}
		reg := template.NewRegistry(*dataDir)
		var t template.Template
		var err error
		if *fromDir != "" {
			t, err = reg.ImportDir(ctx, fs.Arg(0), *fromDir)
		} else {
			t, err = reg.ImportTar(ctx, fs.Arg(0), *fromTar)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "template %s registered (%s)\n", t.Name, t.Digest)
		return nil
	case "ls":
		asJSON := fs.Bool("json", false, "print JSON")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		ts, err := template.NewRegistry(*dataDir).List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(ts)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCPU\tMEMORY_MB\tDISK_MB\tSOURCE\tCREATED")
		for _, t := range ts {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", t.Name, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.Source, t.CreatedAt.Format("2006-01-02 15:04"))
		}
		return tw.Flush()
	case "rm":
		if err := parseFlags(fs, reorder(fs, args[1:])); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return usageError{"usage: cube template rm NAME"}
		}
		return template.NewRegistry(*dataDir).Delete(ctx, fs.Arg(0))
	default:
		return usageError{fmt.Sprintf("unknown template command %q (create, ls, rm)", args[0])}
	}
}

// reorder moves positional arguments after flags so `create NAME --from-dir X`
// parses like `create --from-dir X NAME`. Boolean flags take no value.
func reorder(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) > 1 && a[0] == '-' {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil {
				if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
					continue
				}
			}
			if i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	return append(flags, pos...)
}

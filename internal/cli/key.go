package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/cube-dev/cube/internal/store"
)

// runKey is `cube key create|ls|revoke`: API keys in the server's SQLite
// store (<data-dir>/server.db). Keys are stored as hashes; the plaintext is
// printed once, by create.
func runKey(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "usage: cube key create [--name NAME] | ls | revoke ID  [--data-dir DIR]"
	if len(args) == 0 {
		return usageError{usage}
	}
	fs := newFlagSet("key "+args[0], stderr)
	dataDir := fs.String("data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory (env CUBE_DATA_DIR)")
	name := fs.String("name", "", "name of the new key (create)")
	if err := parseFlags(fs, reorder(fs, args[1:])); err != nil {
		return err
	}
	open := func() (*store.SQLite, error) {
		return store.OpenSQLite(ctx, filepath.Join(*dataDir, "server.db"))
	}
	switch args[0] {
	case "create":
		if fs.NArg() != 0 {
			return usageError{usage}
		}
		st, err := open()
		if err != nil {
			return err
		}
		defer st.Close()
		key, err := st.CreateKey(ctx, *name)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, key)
		fmt.Fprintln(stderr, "store this key now: only its hash is kept")
		return nil
	case "ls":
		if fs.NArg() != 0 {
			return usageError{usage}
		}
		st, err := open()
		if err != nil {
			return err
		}
		defer st.Close()
		keys, err := st.ListKeys(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tCREATED\tLAST USED\tSTATUS")
		for _, k := range keys {
			status := "active"
			if k.RevokedAt != nil {
				status = "revoked " + k.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.UTC().Format(time.RFC3339), timeOrDash(k.LastUsedAt), status)
		}
		return tw.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return usageError{"usage: cube key revoke ID [--data-dir DIR]"}
		}
		st, err := open()
		if err != nil {
			return err
		}
		defer st.Close()
		if err := st.RevokeKey(ctx, fs.Arg(0)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked %s\n", fs.Arg(0))
		return nil
	default:
		return usageError{usage}
	}
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

package cli

import (
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/store"
)

// newKeyCmd is `cube key create|ls|revoke`: API keys in the server's SQLite
// store (<data-dir>/server.db). Keys are stored as hashes; the plaintext is
// printed once, by create.
func newKeyCmd() *cobra.Command {
	return group("key", "manage API keys: create [--name N], ls, revoke ID",
		newKeyVerb("create", "create an API key and print it (only its hash is kept)", noArgs),
		newKeyVerb("ls", "list API keys", noArgs),
		newKeyVerb("revoke ID", "revoke an API key", exactArgs(1, "usage: cube key revoke ID [--data-dir DIR]")),
	)
}

func newKeyVerb(use, short string, args cobra.PositionalArgs) *cobra.Command {
	var dataDir, name string
	c := &cobra.Command{Use: use, Short: short, Args: args}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, out := cmd.Context(), cmd.OutOrStdout()
		st, err := store.OpenSQLite(ctx, filepath.Join(dataDir, "server.db"))
		if err != nil {
			return err
		}
		defer st.Close()
		switch c.Name() {
		case "create":
			key, err := st.CreateKey(ctx, name)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, key)
			fmt.Fprintln(cmd.ErrOrStderr(), "store this key now: only its hash is kept")
			return nil
		case "ls":
			keys, err := st.ListKeys(ctx)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tCREATED\tLAST USED\tSTATUS")
			for _, k := range keys {
				status := "active"
				if k.RevokedAt != nil {
					status = "revoked " + k.RevokedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.UTC().Format(time.RFC3339), timeOrDash(k.LastUsedAt), status)
			}
			return tw.Flush()
		default: // revoke
			if err := st.RevokeKey(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(out, "revoked %s\n", args[0])
			return nil
		}
	}
	addDataDirFlag(c, &dataDir)
	// Every verb has always accepted --name; only create uses it.
	c.Flags().StringVar(&name, "name", "", "name of the new key")
	if c.Name() != "create" {
		c.Flags().MarkHidden("name")
	}
	return c
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/version"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.ArbitraryArgs, // as before: `cube version` ignored what followed
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "cube", version.Version)
			return err
		},
	}
}

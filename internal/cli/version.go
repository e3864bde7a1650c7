package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/cube-dev/cube/internal/version"
)

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) error {
	fmt.Fprintln(stdout, "cube", version.Version)
	return nil
}

package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envAnnotation is the pflag annotation listing the environment variables
// bound to a flag, first match wins.
const envAnnotation = "cube.dev/env"

// bindEnv binds the environment variables envs (the first one set wins) to
// the flag name of fs: flag beats environment beats the built-in default.
// The flag's help says which variables it reads.
func bindEnv(fs *pflag.FlagSet, name string, envs ...string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("bindEnv: no flag --" + name) // a programming error, caught by TestHelpEveryCommand
	}
	f.Usage += " (env " + strings.Join(envs, ", else ") + ")"
	if err := fs.SetAnnotation(name, envAnnotation, envs); err != nil {
		panic(err)
	}
}

// applyEnv sets each flag of cmd that is not on the command line from its
// bound environment variable, if set and not empty (an empty variable is
// unset, as before). A value the flag rejects is a usage error naming the
// variable, so `CUBE_POOL_SIZE=abc cube up` fails before anything starts
// instead of running with the default.
func applyEnv(cmd *cobra.Command) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		for _, env := range f.Annotations[envAnnotation] {
			v := os.Getenv(env)
			if v == "" {
				continue
			}
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, usageError{fmt.Sprintf("invalid %s %q (for --%s): %v", env, v, f.Name, plainError(f, err))})
			}
			return
		}
	})
	return errors.Join(errs...)
}

// plainError says what a flag of a built-in type wants instead of quoting
// strconv ("strconv.ParseInt: parsing "abc": invalid syntax").
func plainError(f *pflag.Flag, err error) error {
	var ne *strconv.NumError
	if !errors.As(err, &ne) {
		return err
	}
	switch f.Value.Type() {
	case "bool":
		return errors.New("want true or false")
	case "int", "int32", "int64", "uint", "uint16", "uint32", "uint64":
		return errors.New("want an integer")
	case "duration":
		return errors.New("want a duration such as 30s or 2m")
	}
	return err
}

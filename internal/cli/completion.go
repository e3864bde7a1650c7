package cli

import (
	"github.com/spf13/cobra"
)

// flagValues are the fixed values shell completion offers for a flag,
// wherever a command has it.
var flagValues = map[string][]string{
	"log-level":     logLevels,
	"userns":        {"auto", "on", "off"},
	"host-mount-ns": {"auto", "off"},
	"host-netns":    {"auto"},
	"roles":         serverRoles,
	"policy":        {"kill", "wait"},
	"runtime":       {"auto", "ns", "vm"},
}

// dirFlags complete to directories.
var dirFlags = []string{"data-dir", "run-dir", "prep-dir", "dir", "from-dir", "sdk-dir", "cni-conf-dir", "from", "to"}

// addCompletions registers value completion for the flags above on every
// command of the tree (`cube completion bash|zsh|fish` prints the scripts
// that use it).
func addCompletions(c *cobra.Command) {
	for name, values := range flagValues {
		if c.Flags().Lookup(name) != nil {
			_ = c.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
		}
	}
	for _, name := range dirFlags {
		if c.Flags().Lookup(name) != nil {
			_ = c.MarkFlagDirname(name)
		}
	}
	for _, sub := range c.Commands() {
		addCompletions(sub)
	}
}

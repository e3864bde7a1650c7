package cli

import (
	"os"
	"runtime/debug"
)

// serverGCPercent is the GC target of the long-running commands (up,
// server, cubelet) unless GOGC is set. Their live heap is small (~2 MB with
// hundreds of sandboxes) and the runtime's 4 MB minimum heap made them
// collect every few MB of garbage: ~3 GCs a second while a pool refills,
// 3-5 ms of CPU each, taken from creates. At 400 the heap may grow to five
// times the live data (~10-16 MB) between collections.
const serverGCPercent = 400

// tuneServerGC applies serverGCPercent when GOGC is not set. It changes
// this process only: shims and sandboxes get their own environments.
func tuneServerGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(serverGCPercent)
	}
}

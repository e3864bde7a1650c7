// Package nodeops holds the operations run on a node outside its cubelet:
// the operator's offline repairs and reports (mapdump, doctor, gc,
// cleanup) and the steps the Helm chart's Pods run around the cubelet
// (prep, wait-prep, share-mounts, stop-cubelet). Each takes the node's
// cubelet.Config, or plain options, and writes a report for people to
// read; internal/cli only parses flags and calls these.
package nodeops

import (
	"encoding/json"
	"io"
)

// Format selects how a report is written.
type Format int

const (
	Text Format = iota // aligned lines for people
	JSON               // one indented document, for scripts and tests
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Package nldump repeats netlink dumps that the kernel interrupted. A dump
// of links, addresses or routes that changed while it ran ends with
// NLM_F_DUMP_INTR; vishvananda/netlink then returns what it read together
// with netlink.ErrDumpInterrupted. On a node that creates and deletes veths
// all the time (creates, kills, pool refills, some of them outside the
// dataplane lock) that happens, and such a result is not a listing to act
// on: the dump is simply run again.
package nldump

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// Attempts is how often Retry runs a dump that keeps being interrupted.
const Attempts = 10

// Retry runs dump until it is not interrupted, at most Attempts times, and
// returns its last result. An error other than an interruption is returned
// at once.
func Retry[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for range Attempts {
		if v, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, fmt.Errorf("netlink dump interrupted %d times in a row: %w", Attempts, err)
}

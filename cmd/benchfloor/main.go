// Command benchfloor is the static responder that `cube bench` starts in
// fresh namespaces to measure the floor of a sandbox create: clone + exec +
// one answer on a socket. Build it with CGO_ENABLED=0.
package main

import (
	"os"

	"github.com/cube-dev/cube/internal/bench/responder"
)

func main() { os.Exit(responder.Main()) }

// Command envd is the in-sandbox agent serving the E2B envd protocol.
package main

import (
	"os"

	"github.com/cube-dev/cube/internal/envd"
)

func main() {
	os.Exit(envd.Main(os.Args[1:]))
}

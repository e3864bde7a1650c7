// Package version holds the build's version, reported by every Cube binary
// and compared at cubelet registration (version skew policy).
package version

// Version is the semantic version of this build. Override at link time with
// -ldflags "-X github.com/cube-dev/cube/internal/version.Version=v0.2.0".
var Version = "v0.1.0"

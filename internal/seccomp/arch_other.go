//go:build !amd64 && !arm64

package seccomp

const cloneFlagsArg = 0

func nativeArch() (uint32, bool) { return 0, false }

func archRules() []Rule { return nil }

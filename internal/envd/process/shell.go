package process

import (
	"os"

	"google.golang.org/protobuf/proto"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
)

// sdkShell is the shell the E2B SDKs ask for in `commands.run`:
// `/bin/bash -l -c CMD`. Upstream envd runs it as given, so in an image
// without bash (busybox, distroless with a shell) every SDK command fails.
const sdkShell = "/bin/bash"

// shells are the paths checked for the fallback, inside the sandbox (envd's
// root is the sandbox's). A variable so that tests can point bash at a path
// that does not exist.
var shells = struct{ bash, sh string }{bash: sdkShell, sh: "/bin/sh"}

// shellFallback returns cfg unchanged, except for the SDK's exact
// `/bin/bash -l -c CMD` in a sandbox where /bin/bash does not exist and
// /bin/sh does: then a copy running `/bin/sh -l -c CMD`. -l is kept: busybox
// ash and dash take it and, like a login bash, read /etc/profile and
// ~/.profile (a POSIX sh that rejected -l would fail the command with its
// usage message). Any other form (another shell, other flags, a PTY's
// `-i -l`) runs as asked, as upstream envd does.
func shellFallback(cfg *pb.ProcessConfig) *pb.ProcessConfig {
	a := cfg.GetArgs()
	if cfg.GetCmd() != sdkShell || len(a) != 3 || a[0] != "-l" || a[1] != "-c" {
		return cfg
	}
	if _, err := os.Stat(shells.bash); !os.IsNotExist(err) {
		return cfg
	}
	if executable(shells.sh) != nil {
		return cfg // the "not found" error then names /bin/bash, the command asked for
	}
	out := proto.Clone(cfg).(*pb.ProcessConfig)
	out.Cmd = shells.sh
	return out
}

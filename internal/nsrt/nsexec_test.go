package nsrt

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNsexecRequests drives cube-nsexec by hand, as pid 1 does (handshake,
// id maps, request), with good and bad requests: it must exec the
// workload hardened, end silently when pid 1 gives up, and refuse a
// request it cannot read with one clear line.
func TestNsexecRequests(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (user namespace with a mapped range)")
	}
	bin := nsexecBinary(t)
	good, err := encodeNsexecRequest(execRequest{
		Path: "/bin/sh", Args: []string{"sh", "-c", `grep -E '^(Uid|Gid|Cap|NoNewPrivs|Seccomp)' /proc/self/status; echo "X=$X"`},
		Env: []string{"X=42", "PATH=/usr/bin:/bin"},
	}, SandboxCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	var keep uint64
	for _, c := range SandboxCapabilities {
		keep |= 1 << c
	}
	for _, tc := range []struct {
		name     string
		stopAt   byte   // 'u': pid 1 gives up before mapping the ids
		req      []byte // sent after 'm', then EOF
		wantCode int
		wantOut  []string
		wantErr  string // "" = nothing on stderr
	}{
		{name: "good", req: good, wantOut: []string{
			"Uid:\t0\t0\t0\t0", "Gid:\t0\t0\t0\t0", fmt.Sprintf("CapBnd:\t%016x", keep), fmt.Sprintf("CapEff:\t%016x", keep),
			"CapInh:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2", "X=42",
		}},
		{name: "pid 1 gives up before the maps", stopAt: 'u', wantCode: 1},
		{name: "pid 1 gives up before the request", req: nil, wantCode: 1},
		{name: "other protocol", req: []byte("CUBENSX9rest"), wantCode: 1, wantErr: "not protocol CUBENSX1"},
		{name: "truncated", req: good[:len(good)-3], wantCode: 1, wantErr: "exec request: truncated"},
		{name: "trailing bytes", req: append(bytes.Clone(good), 0), wantCode: 1, wantErr: "1 bytes left over"},
		{name: "missing program", req: mustEncode(t, execRequest{Path: "/nonexistent", Args: []string{"x"}}), wantCode: 1,
			wantErr: "exec /nonexistent: No such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runNsexec(t, bin, UserNSForSlot(7), tc.stopAt, tc.req)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.wantCode, stderr)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(stdout, w+"\n") {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			if tc.wantErr == "" && stderr != "" {
				t.Errorf("stderr %q, want none", stderr)
			}
			if tc.wantErr != "" && (!strings.Contains(stderr, tc.wantErr) || !strings.HasPrefix(stderr, "sandbox-init: workload: ")) {
				t.Errorf("stderr %q, want a line with %q", stderr, tc.wantErr)
			}
		})
	}
}

func mustEncode(t *testing.T, req execRequest) []byte {
	t.Helper()
	b, err := encodeNsexecRequest(req, SandboxCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runNsexec runs bin with fd 4 a socket and plays pid 1 on it; it stops
// (closes the socket) after receiving stopAt, if set.
func runNsexec(t *testing.T, bin string, u *UserNS, stopAt byte, req []byte) (code int, stdout, stderr string) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "pid1"), os.NewFile(uintptr(fds[1]), "nsexec")
	defer mine.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.ExtraFiles = []*os.File{null, theirs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	func() {
		if err := expectByte(mine, 'u'); err != nil {
			t.Errorf("no 'u': %v", err)
			return
		}
		if stopAt == 'u' {
			return
		}
		m := fmt.Appendf(nil, "0 %d %d\n", u.HostID, u.Size)
		pid := strconv.Itoa(cmd.Process.Pid)
		for _, f := range []string{"uid_map", "gid_map"} {
			if err := os.WriteFile("/proc/"+pid+"/"+f, m, 0); err != nil {
				t.Errorf("write %s: %v", f, err)
				return
			}
		}
		if _, err := mine.Write(append([]byte{'m'}, req...)); err != nil {
			t.Errorf("send the request: %v", err)
		}
	}()
	mine.Close()
	err = cmd.Wait()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatalf("cube-nsexec: %v", err)
	}
	return code, out.String(), errb.String()
}

package seccomp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Event is one syscall the kernel logged for a filter installed with
// Options.Log: an audit record of type 1326 (AUDIT_SECCOMP). Without an
// audit daemon the kernel prints these records to its log (/dev/kmsg,
// dmesg), rate-limited.
type Event struct {
	PID     int    // in the host's pid namespace
	UID     int    // host uid
	Comm    string // the thread's name
	Exe     string // the executable
	Arch    uint32 // AUDIT_ARCH_* of the call
	Nr      uint32 // syscall number
	Syscall string // name, when Arch is a supported architecture
	// Action is the filter's action without its data (code=): the kernel
	// logs SECCOMP_RET_ERRNO (0x50000) for EPERM and ENOSYS alike.
	Action Verdict
}

// auditSeccompType is AUDIT_SECCOMP.
const auditSeccompType = "type=1326"

// ParseAuditRecord reads an AUDIT_SECCOMP record from a kernel log line,
// e.g. `audit: type=1326 audit(1733..:12): auid=4294967295 uid=0 gid=0
// ses=4294967295 pid=1234 comm="python3" exe="/usr/bin/python3.11" sig=0
// arch=c000003e syscall=323 compat=0 ip=0x7f.. code=0x50001`, with or
// without the /dev/kmsg prefix. ok is false for any other line.
func ParseAuditRecord(line string) (e Event, ok bool) {
	i := strings.Index(line, auditSeccompType)
	if i < 0 {
		return Event{}, false
	}
	fields := map[string]string{}
	rest := line[i+len(auditSeccompType):]
	// /dev/kmsg may add "\n KEY=value" dictionary lines.
	rest, _, _ = strings.Cut(rest, "\n")
	rest = strings.TrimRight(rest, " \r")
	for rest != "" {
		rest = strings.TrimLeft(rest, " ")
		k, after, found := strings.Cut(rest, "=")
		if !found || strings.ContainsAny(k, " \"") {
			// a word without '=' (audit(...):): skip it
			if sp := strings.IndexByte(rest, ' '); sp >= 0 {
				rest = rest[sp:]
				continue
			}
			break
		}
		var v string
		if strings.HasPrefix(after, "\"") {
			end := strings.IndexByte(after[1:], '"')
			if end < 0 {
				return Event{}, false
			}
			v, rest = after[1:1+end], after[2+end:]
		} else if sp := strings.IndexByte(after, ' '); sp >= 0 {
			v, rest = after[:sp], after[sp:]
		} else {
			v, rest = after, ""
		}
		fields[k] = v
	}
	pid, err1 := strconv.Atoi(fields["pid"])
	nr, err2 := strconv.ParseUint(fields["syscall"], 10, 32)
	arch, err3 := strconv.ParseUint(fields["arch"], 16, 32)
	code, err4 := strconv.ParseUint(strings.TrimPrefix(fields["code"], "0x"), 16, 32)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Event{}, false
	}
	e = Event{PID: pid, Comm: fields["comm"], Exe: fields["exe"], Arch: uint32(arch), Nr: uint32(nr), Action: Verdict(code)}
	e.UID, _ = strconv.Atoi(fields["uid"])
	for _, a := range Arches {
		if a.Audit == e.Arch {
			e.Syscall = a.Name(e.Nr)
		}
	}
	return e, true
}

// KmsgPath is the kernel log device Watch reads.
const KmsgPath = "/dev/kmsg"

// Watch calls fn for every AUDIT_SECCOMP record the kernel logs from now
// until ctx ends (it starts at the end of the log). It needs read access
// to /dev/kmsg (root, or CAP_SYSLOG with kernel.dmesg_restrict). Records
// the kernel dropped (rate limit, full buffer) are not seen.
func Watch(ctx context.Context, fn func(Event)) error {
	f, err := os.OpenFile(KmsgPath, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("seccomp log: open %s: %w", KmsgPath, err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return fmt.Errorf("seccomp log: seek %s: %w", KmsgPath, err)
	}
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	defer f.Close()
	// /dev/kmsg returns one record per read; a record is at most ~8 KiB.
	// The fd is non-blocking, so the Go poller parks Read and Close ends it.
	buf := make([]byte, 16<<10)
	for {
		n, err := f.Read(buf)
		switch {
		case err == nil:
			if e, ok := ParseAuditRecord(string(buf[:n])); ok {
				fn(e)
			}
		case errors.Is(err, unix.EPIPE):
			// Records were overwritten before we read them; go on.
		case ctx.Err() != nil:
			return nil
		default:
			return fmt.Errorf("seccomp log: read %s: %w", KmsgPath, err)
		}
	}
}

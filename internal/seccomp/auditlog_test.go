package seccomp

import (
	"testing"

	"golang.org/x/sys/unix"
)

const sampleRecord = `6,3101,35039061258,-;audit: type=1326 audit(1796171461.765:5): auid=4294967295 uid=1073741824 gid=0 ses=4294967295 pid=30872 comm="my prog" exe="/usr/bin/python3.11" sig=0 arch=c000003e syscall=323 compat=0 ip=0x40908e code=0x50000
 SUBSYSTEM=audit`

func TestParseAuditRecord(t *testing.T) {
	e, ok := ParseAuditRecord(sampleRecord)
	if !ok {
		t.Fatal("record not parsed")
	}
	want := Event{PID: 30872, UID: 1 << 30, Comm: "my prog", Exe: "/usr/bin/python3.11", Arch: unix.AUDIT_ARCH_X86_64,
		Nr: 323, Syscall: "userfaultfd", Action: Verdict(unix.SECCOMP_RET_ERRNO)}
	if e != want {
		t.Errorf("parsed %+v, want %+v", e, want)
	}
	// dmesg's form, an AArch64 record.
	e, ok = ParseAuditRecord(`[  1.0] audit: type=1326 audit(1.2:3): auid=1 uid=0 gid=0 ses=1 pid=7 comm="a" exe="/a" sig=0 arch=c00000b7 syscall=282 compat=0 ip=0x1 code=0x50000`)
	if !ok || e.Syscall != "userfaultfd" || e.PID != 7 {
		t.Errorf("arm64 record: %+v %v", e, ok)
	}
	for _, bad := range []string{
		"",
		"audit: type=1400 audit(1.2:3): apparmor=DENIED",
		`audit: type=1326 audit(1.2:3): pid=x syscall=1 arch=c000003e code=0x50000`,
		`audit: type=1326 audit(1.2:3): pid=1 comm="unterminated syscall=1 arch=c000003e code=0x50000`,
		`audit: type=1326 pid=1 syscall=1 code=0x50000`,
	} {
		if e, ok := ParseAuditRecord(bad); ok {
			t.Errorf("%q parsed as %+v", bad, e)
		}
	}
}

func FuzzParseAuditRecord(f *testing.F) {
	f.Add(sampleRecord)
	f.Add(`audit: type=1326 audit(1.2:3): pid=1 comm="" exe="" arch=c00000b7 syscall=99999 code=0x80000000`)
	f.Add("type=1326 a=\"")
	f.Fuzz(func(t *testing.T, line string) {
		e, ok := ParseAuditRecord(line)
		if !ok && e != (Event{}) {
			t.Errorf("rejected line gave %+v", e)
		}
	})
}

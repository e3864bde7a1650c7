// Package residency lets a long-idle process unmap the pages of its own
// executable that it touched only while starting.
//
// A Cube sandbox's shim, pid 1 and envd start, then idle for the sandbox's
// whole life. Starting runs much of their code (package init, flag and
// spec parsing, namespace set-up), and the kernel maps executable pages
// around every fault (fault-around, 64 KiB by default), so each process
// ends up with most of its binary in its resident set: ~7 MiB of envd's
// 9 MiB RSS. Those pages live once in the page cache, shared by every
// sandbox, but every process keeps page-table entries for them and counts
// them in its RSS.
//
// DropExecutablePages discards this process's mappings of its executable's
// read-only segments (text and rodata) with MADV_DONTNEED. Nothing is lost:
// the segments are never written, so the next access faults the page back
// in from the page cache (a minor fault, no I/O while the binary is
// cached). Writable segments (data, bss) and all anonymous memory are left
// alone.
package residency

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// DropExecutablePages unmaps the resident pages of this process's
// executable's read-only mappings and returns how many bytes of mappings
// it covered.
func DropExecutablePages() (int64, error) {
	var exe unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &exe); err != nil {
		return 0, fmt.Errorf("stat own executable: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	var dropped int64
	for _, m := range readOnlyMappings(maps, exe.Dev, exe.Ino) {
		// By address: the range is a mapping of this process, not Go memory.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_DONTNEED); errno != 0 {
			return dropped, fmt.Errorf("madvise %x-%x: %w", m.start, m.end, errno)
		}
		dropped += int64(m.end - m.start)
	}
	return dropped, nil
}

type mapping struct{ start, end uintptr }

// readOnlyMappings returns the mappings in a /proc/<pid>/maps listing that
// are private, not writable and backed by the file dev/ino.
func readOnlyMappings(maps []byte, dev, ino uint64) []mapping {
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// start-end perms offset major:minor inode [path]
		f := bytes.Fields(sc.Bytes())
		if len(f) < 5 {
			continue
		}
		perms := string(f[1])
		if len(perms) != 4 || perms[1] == 'w' || perms[3] != 'p' {
			continue
		}
		if n, err := strconv.ParseUint(string(f[4]), 10, 64); err != nil || n != ino {
			continue
		}
		ma, mi, ok := hexPair(f[3], ":")
		if !ok || ma > 0xffffffff || mi > 0xffffffff || unix.Mkdev(uint32(ma), uint32(mi)) != dev {
			continue
		}
		s, e, ok := hexPair(f[0], "-")
		if !ok || e <= s {
			continue
		}
		out = append(out, mapping{uintptr(s), uintptr(e)})
	}
	return out
}

// hexPair parses "a<sep>b" of two hexadecimal numbers.
func hexPair(field []byte, sep string) (a, b uint64, ok bool) {
	x, y, found := bytes.Cut(field, []byte(sep))
	if !found {
		return 0, 0, false
	}
	a, err1 := strconv.ParseUint(string(x), 16, 64)
	b, err2 := strconv.ParseUint(string(y), 16, 64)
	return a, b, err1 == nil && err2 == nil
}

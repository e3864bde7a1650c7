package residency

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadOnlyMappings(t *testing.T) {
	maps := `00400000-00771000 r-xp 00000000 fd:01 1234 /bin/x
00771000-00b20000 r--p 00371000 fd:01 1234 /bin/x
00b20000-00b72000 rw-p 00720000 fd:01 1234 /bin/x
00b72000-00b80000 r--s 00000000 fd:01 1234 /bin/x
00c00000-00c10000 r-xp 00000000 fd:01 9999 /bin/other
00d00000-00d10000 r-xp 00000000 fd:02 1234 /other/fs/same/inode
7fff0000-7fff1000 rw-p 00000000 00:00 0
garbage line
`
	got := readOnlyMappings([]byte(maps), unix.Mkdev(0xfd, 0x01), 1234)
	want := []mapping{{0x400000, 0x771000}, {0x771000, 0xb20000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %x, want %x", got, want)
	}
}

// TestDropExecutablePages: the test binary's read-only mappings leave its
// resident set, and its code still runs afterwards.
func TestDropExecutablePages(t *testing.T) {
	before := exeRSS(t)
	n, err := DropExecutablePages()
	if err != nil {
		t.Fatal(err)
	}
	after := exeRSS(t)
	if n == 0 || after >= before {
		t.Fatalf("dropped %d bytes of mappings; executable RSS %d -> %d KiB", n, before, after)
	}
	// Code and read-only data fault back in.
	if got := strings.Repeat("ab", 3) + strconv.Itoa(42); got != "ababab42" {
		t.Fatal(got)
	}
	t.Logf("executable RSS %d -> %d KiB", before, after)
}

// exeRSS sums the Rss of this process's read-only executable mappings (KiB).
func exeRSS(t *testing.T) int64 {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	inExe := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && strings.Contains(f[0], "-") {
			inExe = f[5] == exe && !strings.Contains(f[1], "w")
			continue
		}
		if inExe && len(f) >= 2 && f[0] == "Rss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb
		}
	}
	return total
}

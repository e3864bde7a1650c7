package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Rollup is the part of /proc/<pid>/smaps_rollup the bench reports, in KiB.
type Rollup struct {
	RSS     int64 `json:"rssKiB"`
	PSS     int64 `json:"pssKiB"`
	PSSAnon int64 `json:"pssAnonKiB"`
	PSSFile int64 `json:"pssFileKiB"`
	Anon    int64 `json:"anonKiB"`
	Private int64 `json:"privateKiB"` // Private_Clean + Private_Dirty
}

// Add sums r and o.
func (r Rollup) Add(o Rollup) Rollup {
	return Rollup{r.RSS + o.RSS, r.PSS + o.PSS, r.PSSAnon + o.PSSAnon, r.PSSFile + o.PSSFile, r.Anon + o.Anon, r.Private + o.Private}
}

// ParseRollup parses the text of a smaps_rollup file.
func ParseRollup(b []byte) (Rollup, error) {
	kv := parseKiBLines(b)
	if _, ok := kv["Rss"]; !ok {
		return Rollup{}, fmt.Errorf("smaps_rollup: no Rss line")
	}
	return Rollup{
		RSS: kv["Rss"], PSS: kv["Pss"], PSSAnon: kv["Pss_Anon"], PSSFile: kv["Pss_File"],
		Anon: kv["Anonymous"], Private: kv["Private_Clean"] + kv["Private_Dirty"],
	}, nil
}

// ReadRollup reads /proc/<pid>/smaps_rollup.
func ReadRollup(pid int) (Rollup, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return Rollup{}, err
	}
	return ParseRollup(b)
}

// MemInfo is the part of /proc/meminfo the bench uses, in KiB.
type MemInfo struct {
	Total     int64 `json:"totalKiB"`
	Available int64 `json:"availableKiB"`
	Slab      int64 `json:"slabKiB"`
	// SReclaimable is the part of Slab the kernel frees under memory
	// pressure (dentry and inode caches).
	SReclaimable int64 `json:"sReclaimableKiB"`
	KernelStack  int64 `json:"kernelStackKiB"`
	PageTables   int64 `json:"pageTablesKiB"`
}

// Used is MemTotal - MemAvailable.
func (m MemInfo) Used() int64 { return m.Total - m.Available }

// Kernel is the memory in kernel objects that grows with processes,
// namespaces and links: slab + kernel stacks + page tables.
func (m MemInfo) Kernel() int64 { return m.Slab + m.KernelStack + m.PageTables }

// ParseMemInfo parses the text of /proc/meminfo.
func ParseMemInfo(b []byte) (MemInfo, error) {
	kv := parseKiBLines(b)
	m := MemInfo{Total: kv["MemTotal"], Available: kv["MemAvailable"], Slab: kv["Slab"], SReclaimable: kv["SReclaimable"],
		KernelStack: kv["KernelStack"], PageTables: kv["PageTables"]}
	if m.Total == 0 {
		return MemInfo{}, fmt.Errorf("meminfo: no MemTotal line")
	}
	return m, nil
}

// ReadMemInfo reads /proc/meminfo.
func ReadMemInfo() (MemInfo, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return MemInfo{}, err
	}
	return ParseMemInfo(b)
}

// parseKiBLines parses "Key:   123 kB" lines; other lines are skipped.
func parseKiBLines(b []byte) map[string]int64 {
	kv := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		kv[strings.TrimSpace(key)] = v
	}
	return kv
}

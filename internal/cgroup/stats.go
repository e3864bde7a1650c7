package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Stats are the usage counters of a cgroup.
type Stats struct {
	CPUUsageNs uint64 // total CPU time consumed
	MemUsage   int64  // bytes charged, including page cache
	MemCache   int64  // page cache part of MemUsage
	MemLimit   int64  // bytes, -1 if unlimited
	Pids       int64  // current number of tasks
	// MemLimitHits counts how often usage hit the memory limit (v1
	// memory.failcnt, v2 memory.events "max"); reclaim usually follows.
	// Informational: the v1 counters of kernel 6.18 were seen to stay 0
	// across an OOM kill; OOMKills is the reliable signal.
	MemLimitHits int64
	// OOMKills counts processes the kernel's OOM killer killed in this
	// cgroup because of its limit (v1 memory.oom_control "oom_kill", kernel
	// >= 4.13; v2 memory.events "oom_kill").
	OOMKills int64
	// UnderOOM reports that the cgroup is out of memory right now (v1 only).
	UnderOOM bool
	// PidsLimitHits counts forks refused by pids.max (pids.events "max").
	PidsLimitHits int64
}

// unlimitedV1 is the smallest value v1 reports for "no memory limit"
// (PAGE_COUNTER_MAX rounded to pages); anything at least this big is treated
// as unlimited.
const unlimitedV1 = math.MaxInt64 / 2

// Stats reads the cgroup's counters.
func (c *Cgroup) Stats() (Stats, error) {
	var s Stats
	var err error
	if c.layout.Version == V2 {
		s, err = statsV2(c.dirs["unified"])
	} else {
		s, err = statsV1(c.dirs)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return Stats{}, fmt.Errorf("cgroup %s/%s: %w: %w", c.parent, c.id, errdefs.ErrNotFound, err)
	}
	return s, err
}

func statsV1(dirs map[string]string) (Stats, error) {
	var s Stats
	var err error
	mem := dirs["memory"]
	if s.MemUsage, err = readInt(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return s, err
	}
	if s.MemLimit, err = readInt(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return s, err
	}
	if s.MemLimit >= unlimitedV1 {
		s.MemLimit = -1
	}
	kv, err := readKeyValues(filepath.Join(mem, "memory.stat"))
	if err != nil {
		return s, err
	}
	s.MemCache = kv["total_cache"]
	if _, ok := kv["total_cache"]; !ok {
		s.MemCache = kv["cache"]
	}
	if s.MemLimitHits, err = readInt(filepath.Join(mem, "memory.failcnt")); err != nil {
		return s, err
	}
	// With swap accounting the memory+swap counter is the one that trips.
	if n, err := readInt(filepath.Join(mem, "memory.memsw.failcnt")); err == nil {
		s.MemLimitHits = max(s.MemLimitHits, n)
	}
	oom, err := readKeyValues(filepath.Join(mem, "memory.oom_control"))
	if err != nil {
		return s, err
	}
	s.OOMKills, s.UnderOOM = oom["oom_kill"], oom["under_oom"] == 1
	if s.Pids, err = readInt(filepath.Join(dirs["pids"], "pids.current")); err != nil {
		return s, err
	}
	if s.PidsLimitHits, err = pidsLimitHits(dirs["pids"]); err != nil {
		return s, err
	}
	if d := dirs["cpuacct"]; d != "" {
		n, err := readInt(filepath.Join(d, "cpuacct.usage"))
		if err != nil {
			return s, err
		}
		s.CPUUsageNs = uint64(n)
	}
	return s, nil
}

func statsV2(dir string) (Stats, error) {
	var s Stats
	var err error
	if s.MemUsage, err = readInt(filepath.Join(dir, "memory.current")); err != nil {
		return s, err
	}
	if s.MemLimit, err = readInt(filepath.Join(dir, "memory.max")); err != nil {
		return s, err
	}
	mem, err := readKeyValues(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return s, err
	}
	s.MemCache = mem["file"]
	events, err := readKeyValues(filepath.Join(dir, "memory.events"))
	if err != nil {
		return s, err
	}
	s.MemLimitHits, s.OOMKills = events["max"], events["oom_kill"]
	if s.Pids, err = readInt(filepath.Join(dir, "pids.current")); err != nil {
		return s, err
	}
	if s.PidsLimitHits, err = pidsLimitHits(dir); err != nil {
		return s, err
	}
	cpu, err := readKeyValues(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return s, err
	}
	s.CPUUsageNs = uint64(cpu["usage_usec"]) * 1000
	return s, nil
}

// readInt reads a single integer; "max" reads as -1.
func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return parseInt(file, string(b))
}

func parseInt(file, s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Counters like cpuacct.usage are unsigned; clamp rather than fail.
		if u, uerr := strconv.ParseUint(s, 10, 64); uerr == nil {
			return int64(min(u, math.MaxInt64)), nil
		}
		return 0, fmt.Errorf("parse %s: %w", file, err)
	}
	return n, nil
}

// readKeyValues parses "key value" lines (memory.stat, cpu.stat).
func readKeyValues(file string) (map[string]int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return parseKeyValues(b), nil
}

func parseKeyValues(b []byte) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// pidsLimitHits reads "max N" from pids.events; kernels before 4.x lack the
// file, which reads as zero.
func pidsLimitHits(dir string) (int64, error) {
	kv, err := readKeyValues(filepath.Join(dir, "pids.events"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return kv["max"], err
}

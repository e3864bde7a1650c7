package cgroup

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

const hybridMountinfo = `22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

const v2Mountinfo = `22 27 0:21 / /proc rw,relatime - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`

const comountedMountinfo = `32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
`

func TestParseMountinfo(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    Layout
		wantErr error
	}{
		{
			name: "hybrid host is v1",
			in:   hybridMountinfo,
			want: Layout{Version: V1, Unified: "/sys/fs/cgroup/unified", V1: map[string]string{
				"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct", "cpuset": "/sys/fs/cgroup/cpuset",
				"memory": "/sys/fs/cgroup/memory", "freezer": "/sys/fs/cgroup/freezer", "pids": "/sys/fs/cgroup/pids",
				"name=systemd": "/sys/fs/cgroup/systemd",
			}},
		},
		{
			name: "unified host is v2",
			in:   v2Mountinfo,
			want: Layout{Version: V2, Unified: "/sys/fs/cgroup", V1: map[string]string{}},
		},
		{
			name: "co-mounted cpu,cpuacct",
			in:   comountedMountinfo,
			want: Layout{Version: V1, V1: map[string]string{
				"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
				"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
			}},
		},
		{
			name:    "no cgroups",
			in:      "22 27 0:21 / /proc rw,relatime - proc proc rw\n",
			wantErr: errdefs.ErrUnavailable,
		},
		{
			name:    "v1 without pids",
			in:      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
			wantErr: errdefs.ErrUnavailable,
		},
		{
			name: "garbage lines are skipped",
			in:   "nonsense\n - \n" + v2Mountinfo,
			want: Layout{Version: V2, Unified: "/sys/fs/cgroup", V1: map[string]string{}},
		},
		{
			name: "escaped mount point",
			in:   `30 23 0:26 / /sys/fs/my\040cgroup rw - cgroup2 cgroup2 rw` + "\n",
			want: Layout{Version: V2, Unified: "/sys/fs/my cgroup", V1: map[string]string{}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseMountinfo(strings.NewReader(c.in))
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("err = %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func FuzzParseMountinfo(f *testing.F) {
	f.Add(hybridMountinfo)
	f.Add(v2Mountinfo)
	f.Add(comountedMountinfo)
	f.Add(`1 2 3 4 /a\0 - cgroup2 x rw`)
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseMountinfo(strings.NewReader(s))
		if err == nil && l.Version != V1 && l.Version != V2 {
			t.Fatalf("no version without error: %+v", l)
		}
	})
}

func TestLayoutDirs(t *testing.T) {
	v1, _ := ParseMountinfo(strings.NewReader(hybridMountinfo))
	co, _ := ParseMountinfo(strings.NewReader(comountedMountinfo))
	v2, _ := ParseMountinfo(strings.NewReader(v2Mountinfo))
	cases := []struct {
		name string
		l    Layout
		want map[string]string
		uniq int
	}{
		{"v1", v1, map[string]string{
			"memory": "/sys/fs/cgroup/memory/cube/sb1", "pids": "/sys/fs/cgroup/pids/cube/sb1",
			"cpu": "/sys/fs/cgroup/cpu/cube/sb1", "cpuacct": "/sys/fs/cgroup/cpuacct/cube/sb1",
			"freezer": "/sys/fs/cgroup/freezer/cube/sb1",
		}, 5},
		{"v1 co-mounted", co, map[string]string{
			"memory": "/sys/fs/cgroup/memory/cube/sb1", "pids": "/sys/fs/cgroup/pids/cube/sb1",
			"cpu": "/sys/fs/cgroup/cpu,cpuacct/cube/sb1", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct/cube/sb1",
		}, 3},
		{"v2", v2, map[string]string{"unified": "/sys/fs/cgroup/cube/sb1"}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.l.dirs("cube/sb1")
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("dirs = %v, want %v", got, c.want)
			}
			if n := len(uniqueDirs(got)); n != c.uniq {
				t.Fatalf("unique dirs = %d, want %d", n, c.uniq)
			}
		})
	}
	all := v1.allHierarchyDirs("cube-shims")
	for _, want := range []string{"/sys/fs/cgroup/systemd/cube-shims", "/sys/fs/cgroup/cpuset/cube-shims", "/sys/fs/cgroup/unified/cube-shims"} {
		found := false
		for _, d := range all {
			found = found || d == want
		}
		if !found {
			t.Errorf("allHierarchyDirs misses %s: %v", want, all)
		}
	}
	if got, want := ancestorsV2("/sys/fs/cgroup", "a/b"), []string{"/sys/fs/cgroup", "/sys/fs/cgroup/a", "/sys/fs/cgroup/a/b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ancestorsV2 = %v, want %v", got, want)
	}
}

func TestLimitWrites(t *testing.T) {
	cases := []struct {
		name string
		v    Version
		r    Resources
		want []fileWrite
	}{
		{"v1 all", V1, Resources{CPUCount: 2, MemoryMB: 512, PidsMax: 100}, []fileWrite{
			{"memory", "memory.limit_in_bytes", "536870912", false},
			{"memory", "memory.memsw.limit_in_bytes", "536870912", true},
			{"pids", "pids.max", "100", false},
			{"cpu", "cpu.cfs_period_us", "100000", false},
			{"cpu", "cpu.cfs_quota_us", "200000", false},
		}},
		{"v1 none", V1, Resources{}, []fileWrite{
			{"pids", "pids.max", "max", false},
			{"cpu", "cpu.cfs_period_us", "100000", false},
			{"cpu", "cpu.cfs_quota_us", "-1", false},
		}},
		{"v2 all", V2, Resources{CPUCount: 1, MemoryMB: 256, PidsMax: 64}, []fileWrite{
			{"unified", "memory.max", "268435456", false},
			{"unified", "memory.swap.max", "0", true},
			{"unified", "pids.max", "64", false},
			{"unified", "cpu.max", "100000 100000", false},
		}},
		{"v2 none", V2, Resources{}, []fileWrite{
			{"unified", "memory.max", "max", false},
			{"unified", "pids.max", "max", false},
			{"unified", "cpu.max", "max 100000", false},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := limitWrites(c.v, c.r); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestValidateNames(t *testing.T) {
	l, _ := ParseMountinfo(strings.NewReader(v2Mountinfo))
	for _, c := range []struct{ parent, id string }{
		{"cube", ""}, {"cube", "a/b"}, {"cube", ".."}, {"/abs", "x"}, {"a/../b", "x"}, {"a//b", "x"},
	} {
		if _, err := OpenLayout(l, c.parent, c.id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("OpenLayout(%q, %q) err = %v, want ErrInvalidArgument", c.parent, c.id, err)
		}
	}
	cg, err := OpenLayout(l, "", "sb")
	if err != nil {
		t.Fatal(err)
	}
	if got := cg.Dir("memory"); got != "/sys/fs/cgroup/cube/sb" {
		t.Errorf("default parent dir = %s", got)
	}
	if err := (Resources{MemoryMB: -1}).Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("negative memory accepted: %v", err)
	}
}

func TestParseHelpers(t *testing.T) {
	if n, err := parseInt("f", "max\n"); err != nil || n != -1 {
		t.Errorf("max = %d, %v", n, err)
	}
	if n, err := parseInt("f", "18446744073709551615"); err != nil || n <= 0 {
		t.Errorf("huge = %d, %v", n, err)
	}
	if _, err := parseInt("f", "x"); err == nil {
		t.Error("garbage parsed")
	}
	kv := parseKeyValues([]byte("cache 10\nrss 20\nbad\nfile x\n"))
	if kv["cache"] != 10 || kv["rss"] != 20 || len(kv) != 2 {
		t.Errorf("parseKeyValues = %v", kv)
	}
}

// TestParseMountinfoCostDoesNotGrowWithMounts: every sandbox's shim parses
// mountinfo, which holds the node's sandbox mounts; lines that are not
// cgroup mounts must cost no allocation (the parser kept a 64 KiB buffer
// and a string per line, ~130 KiB of a shim's start-up garbage).
func TestParseMountinfoCostDoesNotGrowWithMounts(t *testing.T) {
	withMounts := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("900 31 0:99 / /var/lib/cube/node/sandboxes/sbx")
			b.WriteString(strings.Repeat("x", i%7))
			b.WriteString("/rootfs rw,relatime - overlay overlay rw,lowerdir=/a,upperdir=/b,workdir=/c\n")
		}
		return hybridMountinfo + b.String()
	}
	allocs := func(in string) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, err := ParseMountinfo(strings.NewReader(in)); err != nil {
				t.Fatal(err)
			}
		})
	}
	few, many := allocs(withMounts(1)), allocs(withMounts(5000))
	if many > few+2 {
		t.Fatalf("allocations: %.0f with 1 sandbox mount, %.0f with 5000", few, many)
	}
}

// DetectLayout hands out its own copy of the layout it read once: a caller
// changing its map does not change what the next caller gets.
func TestDetectLayoutReturnsACopy(t *testing.T) {
	l1, err := DetectLayout()
	if err != nil {
		t.Skipf("no layout here: %v", err)
	}
	l1.V1["not-a-controller"] = "/nowhere"
	l2, err := DetectLayout()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l2.V1["not-a-controller"]; ok {
		t.Fatal("a caller's change reached the next caller")
	}
	if l2.Version != l1.Version || l2.Unified != l1.Unified {
		t.Fatalf("layout changed between calls: %+v, %+v", l1, l2)
	}
}

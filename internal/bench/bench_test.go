package bench

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func msd(v ...float64) []time.Duration { return msDurations(v) }

func TestPercentileNearestRank(t *testing.T) {
	sorted := msd(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5 * time.Millisecond}, {95, 10 * time.Millisecond}, {99, 10 * time.Millisecond}, {10, time.Millisecond}, {0, time.Millisecond}, {100, 10 * time.Millisecond}} {
		if got := Percentile(sorted, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty input must yield 0")
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	if got := Percentile(hundred, 99); got != 99*time.Millisecond {
		t.Errorf("p99 of 1..100 = %v", got)
	}
}

func TestSummarizeUnsortedInput(t *testing.T) {
	in := msd(30, 10, 20)
	s := Summarize(in, 2, "boom")
	if s.N != 3 || s.Errors != 2 || s.FirstError != "boom" || s.P50Ms != 20 || s.MaxMs != 30 || s.MeanMs != 20 {
		t.Fatalf("summary %+v", s)
	}
	if in[0] != 30*time.Millisecond {
		t.Fatal("Summarize must not reorder its input")
	}
	if z := Summarize(nil, 0, ""); z.N != 0 || z.P99Ms != 0 {
		t.Fatalf("empty summary %+v", z)
	}
}

func TestSamplesKeepsFirstError(t *testing.T) {
	var s Samples
	s.Add(time.Millisecond, nil)
	s.Add(0, errors.New("first"))
	s.Add(0, errors.New("second"))
	sum := s.Summary()
	if sum.N != 1 || sum.Errors != 2 || sum.FirstError != "first" {
		t.Fatalf("%+v", sum)
	}
}

func TestRatio(t *testing.T) {
	if Ratio(10, 4) != 2.5 || Ratio(1, 0) != 0 || Ratio(1, 3) != 0.33 {
		t.Fatal("ratio")
	}
}

const rollup = `00400000-7ffe4c26d000 ---p 00000000 00:00 0                              [rollup]
Rss:               13416 kB
Pss:                3956 kB
Pss_Dirty:          3842 kB
Pss_Anon:           2220 kB
Pss_File:           1736 kB
Pss_Shmem:             0 kB
Shared_Clean:       1464 kB
Shared_Dirty:       9732 kB
Private_Clean:        10 kB
Private_Dirty:      2220 kB
Anonymous:          2220 kB
`

func TestParseRollup(t *testing.T) {
	r, err := ParseRollup([]byte(rollup))
	if err != nil {
		t.Fatal(err)
	}
	want := Rollup{RSS: 13416, PSS: 3956, PSSAnon: 2220, PSSFile: 1736, Anon: 2220, Private: 2230}
	if r != want {
		t.Fatalf("got %+v want %+v", r, want)
	}
	if r.Add(r).PSS != 2*3956 {
		t.Fatal("Add")
	}
	if _, err := ParseRollup([]byte("garbage")); err == nil {
		t.Fatal("want error without Rss")
	}
}

func TestParseMemInfo(t *testing.T) {
	m, err := ParseMemInfo([]byte("MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   20000000 kB\nSlab: 300 kB\nSReclaimable: 120 kB\nKernelStack: 20 kB\nPageTables: 5 kB\nHugePages_Total: 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Used() != 4000000 || m.Kernel() != 325 || m.SReclaimable != 120 {
		t.Fatalf("%+v", m)
	}
	if _, err := ParseMemInfo(nil); err == nil {
		t.Fatal("want error on empty meminfo")
	}
}

func TestParseSDK(t *testing.T) {
	out := []byte(`{"serial":{"create":[10,20],"firstCmd":[1,2],"total":[11,22],"kill":[5],"errors":[]},
	"concurrent":{"create":[100],"firstCmd":[3],"total":[103],"kill":[],"errors":["kill: x","y"]}}` + "\n")
	r := ParseSDK(out, 50)
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	if r.Serial.Total.N != 2 || r.Serial.Total.MaxMs != 22 || r.Serial.Concurrency != 1 {
		t.Fatalf("serial %+v", r.Serial)
	}
	if r.Concurrent.Create.Errors != 2 || r.Concurrent.Create.FirstError != "kill: x" || r.Concurrent.Concurrency != 50 {
		t.Fatalf("concurrent %+v", r.Concurrent)
	}
	if ParseSDK([]byte("not json"), 1).Error == "" {
		t.Fatal("want parse error")
	}
}

func TestSplitNul(t *testing.T) {
	got := SplitNul([]byte("cube\x00up\x00--keep-sandboxes\x00"))
	if len(got) != 3 || got[2] != "--keep-sandboxes" {
		t.Fatalf("%q", got)
	}
	if SplitNul(nil) != nil {
		t.Fatal("empty")
	}
}

func TestRatiosAndTable(t *testing.T) {
	floor := &FloorResult{Serial: Summarize(msd(2, 2, 2), 0, ""), Concurrent: Summarize(msd(10), 0, ""), Concurrency: 50}
	r := Result{
		Server: "http://x", Template: "base", Floor: floor,
		RESTSerial:     &CreateResult{Concurrency: 1, Create: Summarize(msd(20, 20, 20), 0, ""), Kill: Summarize(msd(5), 0, "")},
		RESTConcurrent: &CreateResult{Concurrency: 50, Create: Summarize(msd(100), 1, "503"), Kill: Summarize(msd(5), 0, "")},
		Memory:         &MemoryResult{Sandboxes: 2, Measured: 2, Shim: Rollup{PSS: 3000}, OverheadKiB: 3500},
		Restart:        &RestartResult{Sandboxes: 3, Reachable: 3, ServingMs: 250},
	}
	r.Ratios = ratios(r)
	if r.Ratios["restSerial.p50"] != 10 || r.Ratios["restConcurrent.p99"] != 10 {
		t.Fatalf("ratios %v", r.Ratios)
	}
	if _, ok := r.Ratios["sdkSerial.p50"]; ok {
		t.Fatal("no SDK run, no SDK ratio")
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, r); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"REST create->ready, serial", "10.0 / 10.0 / 10.0", "REST create->ready, 50 concurrent", "1 errors, first: 503", "shim pss + kernel) 3500", "(3/3 reachable)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if ratios(Result{}) != nil {
		t.Fatal("no floor, no ratios")
	}
}

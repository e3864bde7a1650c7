package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints r as human-readable tables.
func WriteTable(w io.Writer, r Result) error {
	fmt.Fprintf(w, "Cube bench: %s, template %s; %d CPUs, %.1f GiB, kernel %s, %s\n\n",
		r.Server, r.Template, r.Machine.CPUs, float64(r.Machine.MemTotalK)/(1<<20), r.Machine.Kernel, r.Machine.Time)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency (ms)\tn\terr\tp50\tp95\tp99\tmax\tx floor p50/p95/p99\t")
	row := func(name string, s Summary, floor *Summary) {
		x := ""
		if floor != nil && floor.N > 0 && s.N > 0 {
			x = fmt.Sprintf("%.1f / %.1f / %.1f", Ratio(s.P50Ms, floor.P50Ms), Ratio(s.P95Ms, floor.P95Ms), Ratio(s.P99Ms, floor.P99Ms))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t\n", name, s.N, s.Errors, s.P50Ms, s.P95Ms, s.P99Ms, s.MaxMs, x)
	}
	var fs, fc *Summary
	if f := r.Floor; f != nil {
		fs, fc = &f.Serial, &f.Concurrent
		row("floor: clone+exec+answer, serial", f.Serial, nil)
		row(fmt.Sprintf("floor: clone+exec+answer, %d concurrent", f.Concurrency), f.Concurrent, nil)
	}
	if c := r.RESTSerial; c != nil {
		row("REST create->ready, serial", c.Create, fs)
		row("REST kill, serial", c.Kill, nil)
	}
	if m := r.ScrapeCost; m != nil {
		row("REST create->ready, serial, /metrics not scraped", m.Off.Create, fs)
		row(fmt.Sprintf("REST create->ready, serial, /metrics scraped every %gs", m.EverySec), m.On.Create, fs)
		row("GET /metrics (scrapes during those creates)", m.Scrape, nil)
	}
	if c := r.RESTConcurrent; c != nil {
		row(fmt.Sprintf("REST create->ready, %d concurrent", c.Concurrency), c.Create, fc)
		row(fmt.Sprintf("REST kill, %d concurrent", c.Concurrency), c.Kill, nil)
	}
	if c := r.RESTBackToBack; c != nil {
		row(fmt.Sprintf("REST create->ready, %d concurrent, back to back", c.Concurrency), c.Create, fc)
		row(fmt.Sprintf("REST kill, %d concurrent, back to back", c.Concurrency), c.Kill, nil)
	}
	if s := r.SDK; s != nil && s.Error == "" {
		row("SDK create, serial", s.Serial.Create, fs)
		row("SDK create->first run('true'), serial", s.Serial.Total, fs)
		row("SDK kill, serial", s.Serial.Kill, nil)
		row(fmt.Sprintf("SDK create, %d concurrent", s.Concurrent.Concurrency), s.Concurrent.Create, fc)
		row(fmt.Sprintf("SDK create->first run('true'), %d concurrent", s.Concurrent.Concurrency), s.Concurrent.Total, fc)
		row(fmt.Sprintf("SDK kill, %d concurrent", s.Concurrent.Concurrency), s.Concurrent.Kill, nil)
	}
	if d := r.Density; d != nil {
		if d.AtZero != nil {
			row("REST create->ready, serial, 0 resident", d.AtZero.Create, fs)
		}
		if d.AtFull != nil {
			row(fmt.Sprintf("REST create->ready, serial, %d resident", d.Created), d.AtFull.Create, fs)
		}
		if d.Kill.N > 0 {
			row(fmt.Sprintf("kill with %d sandboxes up", d.Created), d.Kill, nil)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, note := range notes(r) {
		fmt.Fprintln(w, note)
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(w, "\nmemory per idle sandbox (%d sandboxes, %d measured), KiB:\n", m.Sandboxes, m.Measured)
		writeMemory(w, *m)
	}
	if d := r.Density; d != nil {
		stop := "cap reached"
		if !d.HitCap {
			stop = "stopped by: " + d.FirstError
		}
		fmt.Fprintf(w, "\ndensity: %d/%d idle sandboxes in %.1f s (%s); all killed in %.1f s\n", d.Created, d.Cap, d.CreateSec, stop, d.KillSec)
		fmt.Fprintf(w, "  memory used by them: %.1f MiB (shim+envd pss+kernel), host-wide delta %.1f MiB\n",
			float64((d.Memory.OverheadKiB+d.Memory.Envd.PSS)*int64(d.Created))/1024, float64(d.Memory.HostUsedKiB*int64(d.Created))/1024)
		writeMemory(w, d.Memory)
		if d.AtZero != nil && d.AtFull != nil && d.AtZero.Create.N > 0 && d.AtFull.Create.N > 0 {
			fmt.Fprintf(w, "  create at %d resident / at 0: p50 x%.2f, p99 x%.2f\n", d.Created,
				Ratio(d.AtFull.Create.P50Ms, d.AtZero.Create.P50Ms), Ratio(d.AtFull.Create.P99Ms, d.AtZero.Create.P99Ms))
		}
		if d.Restart != nil {
			writeRestart(w, *d.Restart)
		}
	}
	if s := r.Restart; s != nil {
		writeRestart(w, *s)
	}
	return nil
}

func writeRestart(w io.Writer, s RestartResult) {
	fmt.Fprintf(w, "\nrestart with %d sandboxes (%s): stop %.2f s; exec -> /health %.1f ms; exec -> every envd answers via proxy %.1f ms (%d/%d reachable)\n",
		s.Sandboxes, s.Signal, s.StopSec, s.HealthMs, s.ServingMs, s.Reachable, s.Sandboxes)
	if s.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", s.Error)
	}
}

func writeMemory(w io.Writer, m MemoryResult) {
	fmt.Fprintf(w, "  shim          rss %6d  pss %6d  (anon pss %d)\n", m.Shim.RSS, m.Shim.PSS, m.Shim.PSSAnon)
	fmt.Fprintf(w, "  envd (%.0f procs) rss %6d  pss %6d  (anon pss %d)\n", m.EnvdProcs, m.Envd.RSS, m.Envd.PSS, m.Envd.PSSAnon)
	fmt.Fprintf(w, "  sandbox cgroup usage %d (page cache %d)\n", m.CgroupUsageKiB, m.CgroupCacheKiB)
	fmt.Fprintf(w, "  kernel objects (slab+stacks+page tables delta) %d (of which reclaimable slab %d)\n", m.HostKernelKiB, m.HostKernelReclaimableKiB)
	fmt.Fprintf(w, "  => Cube overhead beyond envd (shim pss + kernel) %d\n", m.OverheadKiB)
	fmt.Fprintf(w, "  cross-check, host-wide (noisy): MemTotal-MemAvailable delta %d, minus envd pss %d\n", m.HostUsedKiB, m.HostUsedBeyondEnvdKiB)
	if m.Error != "" {
		fmt.Fprintf(w, "  note: %s\n", m.Error)
	}
}

// notes lists first errors of latency runs and phases that failed.
func notes(r Result) []string {
	var out []string
	add := func(name string, s Summary) {
		if s.Errors > 0 {
			out = append(out, fmt.Sprintf("  %s: %d errors, first: %s", name, s.Errors, s.FirstError))
		}
	}
	if f := r.Floor; f != nil {
		add("floor serial", f.Serial)
		add("floor concurrent", f.Concurrent)
	}
	if c := r.RESTSerial; c != nil {
		add("REST serial create", c.Create)
		add("REST serial kill", c.Kill)
	}
	if m := r.ScrapeCost; m != nil {
		add("metrics phase create, not scraped", m.Off.Create)
		add("metrics phase create, scraped", m.On.Create)
		add("metrics phase scrape", m.Scrape)
	}
	if c := r.RESTConcurrent; c != nil {
		add("REST concurrent create", c.Create)
		add("REST concurrent kill", c.Kill)
	}
	if c := r.RESTBackToBack; c != nil {
		add("REST back-to-back create", c.Create)
		add("REST back-to-back kill", c.Kill)
	}
	if s := r.SDK; s != nil {
		if s.Error != "" {
			out = append(out, "  SDK: "+s.Error)
		} else {
			add("SDK serial", s.Serial.Total)
			add("SDK concurrent", s.Concurrent.Total)
		}
	}
	return out
}

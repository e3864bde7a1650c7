package cubelet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cube-dev/cube/internal/nodestore"
)

// The node's Prometheus metrics (docs/observability.md). Counters and
// histograms are updated by creates, kills and the start-up reconcile;
// gauges (records by state, pool slots, addresses) are read at scrape time.
// Labels are bounded: a create path, a pipeline step, a template on this
// node (resolved first, so a request's unknown name never becomes one); no
// sandbox id.

// Create paths: where in the pipeline a create started (pipeline.go).
const (
	pathCold       = "cold"       // the whole pipeline
	pathPool       = "pool"       // a plain slot (IP, network, egress, disk made ahead)
	pathPrestarted = "prestarted" // a pre-started slot: its sandbox already runs
)

// plainTarget is the template label of plain slots, which fit any template.
const plainTarget = "_plain"

// createBuckets span a pre-started take (milliseconds) to a cold create of
// a big template that runs a start command (tens of seconds).
var createBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

type metrics struct {
	createDuration *prometheus.HistogramVec
	createFailures prometheus.Counter
	stepDuration   *prometheus.HistogramVec
	killDuration   prometheus.Histogram
	killFailures   prometheus.Counter
	poolHits       *prometheus.CounterVec
	poolMisses     *prometheus.CounterVec
	reconciled     *prometheus.GaugeVec
	reconcileTime  prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		createDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cube_cubelet_sandbox_create_duration_seconds",
			Help:    "Duration of successful sandbox creates on this node, from the request reaching the cubelet (turn wait included) to envd answering, by path (cold, pool, prestarted) and template.",
			Buckets: createBuckets,
		}, []string{"path", "template"}),
		createFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cube_cubelet_sandbox_create_failures_total",
			Help: "Sandbox creates on this node that failed (unknown template, no capacity, a failed step).",
		}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cube_cubelet_create_step_duration_seconds",
			Help:    "Duration of each step of the create pipeline that ran, by step and kind (create: for a sandbox; slot: making a warm-pool slot ahead of time).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"kind", "step"}),
		killDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cube_cubelet_sandbox_kill_duration_seconds",
			Help:    "Duration of successful sandbox kills on this node (processes stopped, network, cgroup and state removed).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		killFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cube_cubelet_sandbox_kill_failures_total",
			Help: "Sandbox kills on this node that failed (the record stays for a retry).",
		}),
		poolHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cube_cubelet_pool_hits_total",
			Help: "Creates that took a warm-pool slot, by the created sandbox's template.",
		}, []string{"template"}),
		poolMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cube_cubelet_pool_misses_total",
			Help: "Creates that found no fitting warm-pool slot and ran cold, by template (expected for templates the pool keeps no slots for).",
		}, []string{"template"}),
		reconciled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cube_cubelet_reconcile_sandboxes",
			Help: "What the reconcile at cubelet start found, by outcome: adopted (live, kept), rebuilt (live, record rebuilt), dead (removed), orphans (unowned kernel objects or state swept), bad (unreadable records left), pool_kept, pool_recycled, repaired (mappings re-added).",
		}, []string{"outcome"}),
		reconcileTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cube_cubelet_reconcile_duration_seconds",
			Help: "Wall time of the reconcile at cubelet start.",
		}),
	}
}

// createPath names where a create resumed the pipeline.
func createPath(from *poolSlot) string {
	switch {
	case from == nil:
		return pathCold
	case from.prestarted():
		return pathPrestarted
	default:
		return pathPool
	}
}

// The recording methods do nothing on a nil *metrics (Cubelets made by
// hand in tests).

func (m *metrics) created(path, template string, d time.Duration) {
	if m != nil {
		m.createDuration.WithLabelValues(path, template).Observe(d.Seconds())
	}
}

func (m *metrics) createFailed() {
	if m != nil {
		m.createFailures.Inc()
	}
}

func (m *metrics) poolTake(template string, hit bool) {
	switch {
	case m == nil:
	case hit:
		m.poolHits.WithLabelValues(template).Inc()
	default:
		m.poolMisses.WithLabelValues(template).Inc()
	}
}

func (m *metrics) killed(d time.Duration, err error) {
	switch {
	case m == nil:
	case err != nil:
		m.killFailures.Inc()
	default:
		m.killDuration.Observe(d.Seconds())
	}
}

// recordReconcile keeps the start-up reconcile's report.
func (m *metrics) recordReconcile(rep ReconcileReport) {
	if m == nil {
		return
	}
	for outcome, n := range map[string]int{
		"adopted": len(rep.Adopted), "rebuilt": len(rep.Rebuilt), "dead": len(rep.Dead),
		"orphans": len(rep.Orphans), "bad": len(rep.Bad), "pool_kept": rep.PoolSlots,
		"pool_recycled": len(rep.Recycled), "repaired": rep.Repaired,
	} {
		m.reconciled.WithLabelValues(outcome).Set(float64(n))
	}
	m.reconcileTime.Set(rep.Duration.Seconds())
}

func (m *metrics) observeStep(kind, step string, d time.Duration) {
	if m == nil {
		return
	}
	m.stepDuration.WithLabelValues(kind, step).Observe(d.Seconds())
}

// RegisterMetrics registers the node's metrics with reg.
func (c *Cubelet) RegisterMetrics(reg prometheus.Registerer) error {
	m := c.metrics
	// The pool's templates (a bounded set, from the flags) have hit and
	// miss series from the start, so a hit ratio shows 0, not "no data".
	for _, t := range append([]PoolTarget{{Template: c.poolTemplate()}}, c.cfg.PoolTemplates...) {
		m.poolHits.WithLabelValues(t.Template)
		m.poolMisses.WithLabelValues(t.Template)
	}
	for _, col := range []prometheus.Collector{m.createDuration, m.createFailures, m.stepDuration,
		m.killDuration, m.killFailures, m.poolHits, m.poolMisses, m.reconciled, m.reconcileTime, nodeCollector{c}} {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	return nil
}

var (
	descRecords = prometheus.NewDesc("cube_cubelet_sandboxes",
		"Owner records on this node by state: creating, running, deleting, pooled (warm-pool slots).", []string{"state"}, nil)
	descPoolTarget = prometheus.NewDesc("cube_cubelet_pool_target_slots",
		"Warm-pool slots the node is asked to keep, by template (_plain: plain slots, which fit any template).", []string{"template"}, nil)
	descPoolReady = prometheus.NewDesc("cube_cubelet_pool_ready_slots",
		"Warm-pool slots ready to be taken, by template (_plain: plain slots).", []string{"template"}, nil)
	descPoolSlotCost = prometheus.NewDesc("cube_cubelet_pool_slot_cost_bytes",
		"Memory one warm-pool slot is counted at against --pool-memory-mb, by template: what the slots made measured (16 MiB until one was); a fixed --pool-size does not use it.", []string{"template"}, nil)
	descIPsUsed = prometheus.NewDesc("cube_cubelet_sandbox_ips_used",
		"Sandbox IPs held by records and reservations (sandboxes and pool slots).", nil, nil)
	descIPs = prometheus.NewDesc("cube_cubelet_sandbox_ips",
		"Sandbox IPs in the node CIDR (a few are not handed out: network, gateway, broadcast).", nil, nil)
	descPortsUsed = prometheus.NewDesc("cube_cubelet_host_ports_used",
		"Host ports of the port range held by records, reservations or stray kernel mappings.", nil, nil)
	descPorts = prometheus.NewDesc("cube_cubelet_host_ports",
		"Host ports in the port range (--port-range).", nil, nil)
)

// nodeCollector reads the gauges at scrape time.
type nodeCollector struct{ c *Cubelet }

func (n nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRecords, descPoolTarget, descPoolReady, descPoolSlotCost, descIPsUsed, descIPs, descPortsUsed, descPorts} {
		ch <- d
	}
}

func (n nodeCollector) Collect(ch chan<- prometheus.Metric) {
	c := n.c
	states := map[string]int{nodestore.StateCreating: 0, nodestore.StateRunning: 0, nodestore.StateDeleting: 0, nodestore.StatePooled: 0}
	recs, _ := c.store.List()
	for _, r := range recs {
		states[r.State]++
	}
	for s, k := range states {
		ch <- prometheus.MustNewConstMetric(descRecords, prometheus.GaugeValue, float64(k), s)
	}

	target, ready := c.poolCounts()
	main := c.mainPoolName()
	for t, k := range target {
		ch <- prometheus.MustNewConstMetric(descPoolTarget, prometheus.GaugeValue, float64(k), t)
		ch <- prometheus.MustNewConstMetric(descPoolReady, prometheus.GaugeValue, float64(ready[t]), t)
		key := t
		if t == main {
			key = mainTarget
		}
		ch <- prometheus.MustNewConstMetric(descPoolSlotCost, prometheus.GaugeValue, float64(c.pool.costs.of(key)<<20), t)
	}

	ips, ports := c.addrs.Used()
	cfg := c.dp.Config()
	ch <- prometheus.MustNewConstMetric(descIPsUsed, prometheus.GaugeValue, float64(ips))
	ch <- prometheus.MustNewConstMetric(descIPs, prometheus.GaugeValue, float64(uint64(1)<<(32-cfg.NodeCIDR.Bits())))
	ch <- prometheus.MustNewConstMetric(descPortsUsed, prometheus.GaugeValue, float64(ports))
	ch <- prometheus.MustNewConstMetric(descPorts, prometheus.GaugeValue, float64(int(cfg.PortMax)-int(cfg.PortMin)+1))
}

// mainPoolName is the main target's name in the metrics: the pool
// template, or plainTarget when it keeps plain slots.
func (c *Cubelet) mainPoolName() string {
	if c.cfg.PoolPrestart {
		return c.poolTemplate()
	}
	return plainTarget
}

// poolCounts returns each pool target's size and ready slots, keyed by
// template: the pool template for the main target (plainTarget when it
// keeps plain slots), the template of a PoolTemplates entry. A plain slot
// made while the pool template was missing counts for the main target,
// as the refill counts it; slots no target wants (being dropped) do not
// count.
func (c *Cubelet) poolCounts() (target, ready map[string]int) {
	target, ready = map[string]int{}, map[string]int{}
	main := c.mainPoolName()
	sz := c.sizesAt(time.Now())
	if sz.main > 0 {
		target[main] = sz.main
	}
	for _, t := range c.cfg.PoolTemplates {
		target[t.Template] += sz.extras[t.Template]
	}
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	for _, s := range c.pool.ready {
		// Plain slots in the ready list are ones the pool keeps
		// (reconcilePool dropped the others, the refill makes no others).
		if !c.wantedSlot(s, true) {
			continue
		}
		key := c.slotTarget(s)
		if key == mainTarget {
			key = main
		}
		ready[key]++
	}
	return target, ready
}

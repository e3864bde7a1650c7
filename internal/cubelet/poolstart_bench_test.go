package cubelet

import (
	"testing"
	"time"
)

// BenchmarkCreateStartCmd measures CreateSandbox of a template whose start
// command serves HTTP (busybox httpd) with a ready command that fetches a
// page: cold (the create starts the server and polls the ready command),
// from a started slot (the server is up; the take runs the ready command
// once), and, for reference, from a pre-started slot of the same template
// without a start command. p50-ms and p90-ms are per create; the pool is
// refilled and each sandbox killed outside the timing.
//
//	go test -run '^$' -bench 'CreateStartCmd$' -benchtime 20x ./internal/cubelet
func BenchmarkCreateStartCmd(b *testing.B) {
	const (
		start = "busybox mkdir -p /tmp/www && echo ok > /tmp/www/index.html && exec busybox httpd -f -p 8000 -h /tmp/www"
		ready = "busybox wget -q -O /dev/null http://127.0.0.1:8000/"
	)
	for _, tc := range []struct {
		name     string
		pool     int
		startCmd bool
	}{{"start-cmd/cold", 0, true}, {"start-cmd/started-slot", 2, true}, {"no-start-cmd/prestarted-slot", 2, false}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, templates := benchNode(b)
			cfg.PoolSize, cfg.PoolPrestart, cfg.PoolTemplate = tc.pool, true, "tiny"
			if tc.startCmd {
				setStartCmd(b, templates, "tiny", start, ready)
			}
			benchCreates(b, cfg, templates, 60*time.Second, func(c *Cubelet, id string) {
				if rec, _ := c.store.Get(id); tc.pool > 0 && rec.RuntimeID == id {
					b.Fatalf("create %s ran cold with a full pool", id)
				}
			})
		})
	}
}

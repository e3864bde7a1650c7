package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// ScrapeCostResult is serial create latency on one Cube without and with a
// Prometheus-like scraper of its /metrics, in the same run.
type ScrapeCostResult struct {
	URL      string  `json:"url"`
	EverySec float64 `json:"scrapeEverySec"`
	// Block is the creates per block; blocks alternate off, on, on, off
	// (ABBA), so a drift of the host's load falls on both sides alike.
	Block int          `json:"block"`
	Off   CreateResult `json:"off"`
	On    CreateResult `json:"on"`
	// Scrape is the latency of the scrapes (GET until the last byte).
	Scrape      Summary `json:"scrape"`
	ScrapeBytes int64   `json:"scrapeBytes"`
}

// scrapeBlock is the creates per block: about a second of serial creates,
// so each scraped block holds about one scrape at the default interval.
const scrapeBlock = 20

// RunScrapeCost creates and kills n sandboxes one at a time with nothing
// scraping url and n with a scraper GETting it every `every` (as a
// Prometheus server does, asking for OpenMetrics with gzip), alternating
// blocks of both.
func RunScrapeCost(ctx context.Context, c *Client, url string, n int, every time.Duration) ScrapeCostResult {
	r := ScrapeCostResult{URL: url, EverySec: every.Seconds(), Block: scrapeBlock}
	var on atomic.Bool
	var scrapes Samples
	var size atomic.Int64
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		hc := &http.Client{Timeout: 10 * time.Second}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			if !on.Load() {
				continue
			}
			t0 := time.Now()
			b, err := scrape(sctx, hc, url)
			if sctx.Err() != nil {
				return
			}
			scrapes.Add(time.Since(t0), err)
			size.Store(b)
		}
	})
	var offC, offK, onC, onK Samples
	var offBusy, onBusy time.Duration
	start := time.Now()
	for i := 0; len(offC.D)+offC.Errs < n || len(onC.D)+onC.Errs < n; i++ {
		if ctx.Err() != nil {
			break
		}
		scraped := i%4 == 1 || i%4 == 2
		on.Store(scraped)
		if scraped {
			onBusy += serialCreates(ctx, c, min(scrapeBlock, n-len(onC.D)-onC.Errs), &onC, &onK)
		} else {
			offBusy += serialCreates(ctx, c, min(scrapeBlock, n-len(offC.D)-offC.Errs), &offC, &offK)
		}
	}
	stop()
	wg.Wait()
	wall := time.Since(start)
	r.Off, r.On = finish(1, &offC, &offK, wall), finish(1, &onC, &onK, wall)
	r.Off.PerSec, r.On.PerSec = perSec(r.Off.Create.N, offBusy), perSec(r.On.Create.N, onBusy)
	r.Scrape, r.ScrapeBytes = scrapes.Summary(), size.Load()
	return r
}

// scrape GETs a /metrics page as Prometheus asks for it and returns its
// size on the wire.
func scrape(ctx context.Context, hc *http.Client, url string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	req.Header.Set("Accept-Encoding", "gzip") // set by hand: the body is counted compressed
	res, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	n, err := io.Copy(io.Discard, res.Body)
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return n, err
}

func perSec(n int, busy time.Duration) float64 {
	if busy <= 0 {
		return 0
	}
	return round2(float64(n) / busy.Seconds())
}

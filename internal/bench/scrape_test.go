package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// The metrics phase times n creates of each kind, and scrapes only while
// a scraped block runs: the first block (not scraped) sees no scrape.
func TestRunScrapeCost(t *testing.T) {
	var mu sync.Mutex
	var creates int
	var scrapedAt []int // creates done when each scrape came
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/sandboxes", func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		creates++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"sandboxID":"sb"}`))
	})
	mux.HandleFunc("DELETE /sandboxes/sb", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		scrapedAt = append(scrapedAt, creates)
		mu.Unlock()
		w.Write([]byte("# TYPE a counter\na_total 1\n"))
	})
	mux.HandleFunc("GET /broken", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusInternalServerError) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := NewClient(srv.URL, "k", "base", 4)
	defer c.Close()

	r := RunScrapeCost(context.Background(), c, srv.URL+"/metrics", 50, 5*time.Millisecond)
	if r.Off.Create.N != 50 || r.On.Create.N != 50 || r.Off.Kill.N != 50 || r.On.Create.Errors+r.Off.Create.Errors != 0 {
		t.Fatalf("creates off %+v on %+v", r.Off.Create, r.On.Create)
	}
	if r.Scrape.N == 0 || r.Scrape.Errors != 0 || r.ScrapeBytes == 0 {
		t.Fatalf("scrapes %+v, %d bytes", r.Scrape, r.ScrapeBytes)
	}
	mu.Lock()
	first := scrapedAt[0]
	mu.Unlock()
	if first < scrapeBlock {
		t.Errorf("a scrape after %d creates, inside the first (not scraped) block", first)
	}

	// A failing endpoint is counted as scrape errors, the creates go on.
	r = RunScrapeCost(context.Background(), c, srv.URL+"/broken", 25, 5*time.Millisecond)
	if r.On.Create.N != 25 || r.Scrape.Errors == 0 || r.Scrape.FirstError == "" {
		t.Fatalf("broken endpoint: creates %+v, scrapes %+v", r.On.Create, r.Scrape)
	}
}

package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// RunBursts settles the node before each burst when asked to: the settle
// runs once per burst, after the last burst's sandboxes are all killed;
// every create is timed from its burst's start.
func TestRunBurstsSettlesBeforeEachBurst(t *testing.T) {
	var mu sync.Mutex
	created, live := 0, map[string]bool{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/sandboxes", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		created++
		id := fmt.Sprintf("sb%d", created)
		live[id] = true
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"sandboxID":%q}`, id)
	})
	mux.HandleFunc("DELETE /sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		delete(live, r.PathValue("id"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := NewClient(srv.URL, "k", "base", 16)
	defer c.Close()

	var seen []string // "created/live" at each settle
	settle := func(context.Context) {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%d/%d", created, len(live)))
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // longer than a burst: not in its latency
	}
	r := RunBursts(context.Background(), c, 25, 10, settle)
	if want := []string{"0/0", "10/0", "20/0"}; !slices.Equal(seen, want) {
		t.Errorf("settled at %v (created/live), want %v", seen, want)
	}
	if r.Create.N != 25 || r.Kill.N != 25 || r.Create.Errors+r.Kill.Errors != 0 {
		t.Fatalf("creates %+v kills %+v", r.Create, r.Kill)
	}
	if r.Create.MaxMs >= 20 {
		t.Errorf("slowest create %.1f ms: the settle was timed", r.Create.MaxMs)
	}
	if r.Create.P50Ms < 5 {
		t.Errorf("create p50 %.1f ms, below the server's 5 ms", r.Create.P50Ms)
	}

	seen = nil
	if r := RunBursts(context.Background(), c, 20, 10, nil); r.Create.N != 20 || len(seen) != 0 {
		t.Errorf("back to back: %d creates, %d settles", r.Create.N, len(seen))
	}
}

// The table names both kinds of bursts.
func TestTableShowsBackToBack(t *testing.T) {
	r := Result{
		RESTConcurrent: &CreateResult{Concurrency: 50, Create: Summarize(msd(40), 0, "")},
		RESTBackToBack: &CreateResult{Concurrency: 50, Create: Summarize(msd(400), 2, "429")},
	}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"REST create->ready, 50 concurrent ", "REST create->ready, 50 concurrent, back to back", "REST back-to-back create: 2 errors, first: 429"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

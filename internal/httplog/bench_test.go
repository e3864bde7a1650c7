package httplog

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkAccessLog is what the request boundary costs per API request
// (docs/benchmarks.md): a cheap route (a sandbox GET answering a small
// JSON body, the worst case for the relative cost) without Handler, with
// Handler and the access log off (level warn: ids and metrics only), and
// with it on (info, Cube's text format, one write(2) per line to a real
// file as Cube's stderr would get). "recorder" runs the handler alone;
// "loopback" through a real HTTP server and keep-alive client, as a
// request arrives.
func BenchmarkAccessLog(b *testing.B) {
	mux := http.NewServeMux()
	body := []byte(`{"sandboxID":"i3xk2m0a9d8c7b6","templateID":"base","state":"running","cpuCount":2,"memoryMB":512}`)
	mux.HandleFunc("GET /sandboxes/{sandboxID}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	variants := []struct {
		name  string
		level slog.Level
		wrap  bool
	}{
		{"none", 0, false},
		{"warn", slog.LevelWarn, true},
		{"info", slog.LevelInfo, true},
	}
	for _, v := range variants {
		var h http.Handler = mux
		if v.wrap {
			f, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { f.Close() })
			m, err := NewMetrics(nil)
			if err != nil {
				b.Fatal(err)
			}
			log := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: v.level})).With("component", "access")
			h = Handler(mux, Config{Logger: log, Metrics: m})
		}
		b.Run("recorder/"+v.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/sandboxes/i3xk2m0a9d8c7b6", nil)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
		b.Run("loopback/"+v.name, func(b *testing.B) {
			srv := httptest.NewServer(h)
			defer srv.Close()
			hc := srv.Client()
			url := srv.URL + "/sandboxes/i3xk2m0a9d8c7b6"
			b.ReportAllocs()
			for b.Loop() {
				res, err := hc.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("status %d", res.StatusCode)
				}
			}
		})
	}
}

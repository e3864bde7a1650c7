package cluster_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Two cubelets with default capacity flags take 100 sandboxes of a
// 2-vCPU template at once without a 503. Before, the default
// --cpu-capacity (8 vCPU per core) let a 2-core node take 8.
func TestDefaultCapacityTakesABurst(t *testing.T) {
	c := newCluster(t)
	c.addNodePorts("cap1", 31000, 60)
	c.addNodePorts("cap2", 31060, 60)
	const n = 100
	codes := map[int]int{}
	var failures []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			body, _ := json.Marshal(map[string]any{"templateID": "tiny", "timeout": 600})
			req, _ := http.NewRequest(http.MethodPost, c.url+"/v2/sandboxes", bytes.NewReader(body))
			req.Header.Set("X-API-Key", c.key)
			req.Header.Set("Content-Type", "application/json")
			res, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, err.Error())
				return
			}
			defer res.Body.Close()
			codes[res.StatusCode]++
			if res.StatusCode != http.StatusCreated {
				msg, _ := io.ReadAll(res.Body)
				failures = append(failures, fmt.Sprintf("%d %s", res.StatusCode, msg))
			}
		})
	}
	wg.Wait()
	t.Logf("%d concurrent creates on two default cubelets: %v in %v", n, codes, time.Since(start).Round(time.Millisecond))
	if codes[http.StatusCreated] != n {
		t.Fatalf("status codes %v, want %d x 201; first failures: %v", codes, n, failures[:min(3, len(failures))])
	}
	a, b := c.nodeStatus("cap1").Sandboxes, c.nodeStatus("cap2").Sandboxes
	if a+b != n || a == 0 || b == 0 {
		t.Fatalf("sandboxes per node %d + %d, want %d spread over both", a, b, n)
	}
}

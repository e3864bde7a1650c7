package errhttp

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, fmt.Errorf("node n1: %w", errdefs.ErrNotFound))
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/json" ||
		strings.TrimSpace(rec.Body.String()) != `{"code":404,"message":"node n1: not found"}` {
		t.Fatalf("%d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
}

package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHTTPStatus(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, http.StatusOK},
		{fmt.Errorf("sandbox x: %w", ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", ErrInvalidArgument)), http.StatusBadRequest},
		{ErrConflict, http.StatusConflict},
		{ErrUnauthenticated, http.StatusUnauthorized},
		{ErrResourceExhausted, http.StatusTooManyRequests},
		{ErrUnavailable, http.StatusServiceUnavailable},
		{fmt.Errorf("fork: %w", ErrNotImplemented), http.StatusNotImplemented},
		{errors.New("boom"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		if got := HTTPStatus(c.err); got != c.want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestWriteHTTP(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteHTTP(rec, fmt.Errorf("node n1: %w", ErrNotFound))
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/json" ||
		strings.TrimSpace(rec.Body.String()) != `{"code":404,"message":"node n1: not found"}` {
		t.Fatalf("%d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
}

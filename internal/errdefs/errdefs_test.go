package errdefs

import (
	"errors"
	"fmt"
	"net/http"
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

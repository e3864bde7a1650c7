// Package errdefs defines the small set of error kinds Cube uses across
// packages. Wrap them with fmt.Errorf("...: %w", err) and test with errors.Is;
// map them to HTTP or RPC codes once, at the boundary (see HTTPStatus).
package errdefs

import "errors"

var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrConflict           = errors.New("conflict")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrNotImplemented     = errors.New("not implemented")
)

// HTTPStatus maps an error chain to the HTTP status the E2B SDK expects.
// The codes are spelled as numbers (net/http's names in the comments) so
// that this package does not pull net/http into the per-sandbox supervisor,
// whose memory every sandbox pays for.
func HTTPStatus(err error) int {
	switch {
	case err == nil:
		return 200 // StatusOK
	case errors.Is(err, ErrNotFound):
		return 404 // StatusNotFound
	case errors.Is(err, ErrAlreadyExists), errors.Is(err, ErrConflict):
		return 409 // StatusConflict
	case errors.Is(err, ErrInvalidArgument):
		return 400 // StatusBadRequest
	case errors.Is(err, ErrFailedPrecondition):
		return 412 // StatusPreconditionFailed
	case errors.Is(err, ErrUnavailable):
		return 503 // StatusServiceUnavailable
	case errors.Is(err, ErrResourceExhausted):
		return 429 // StatusTooManyRequests
	case errors.Is(err, ErrUnauthenticated):
		return 401 // StatusUnauthorized
	case errors.Is(err, ErrPermissionDenied):
		return 403 // StatusForbidden
	case errors.Is(err, ErrNotImplemented):
		return 501 // StatusNotImplemented
	default:
		return 500 // StatusInternalServerError
	}
}

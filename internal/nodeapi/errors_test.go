package nodeapi

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestErrorKindsSurviveTheWire(t *testing.T) {
	kinds := []error{errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrInvalidArgument, errdefs.ErrFailedPrecondition,
		errdefs.ErrConflict, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrUnauthenticated,
		errdefs.ErrPermissionDenied, errdefs.ErrNotImplemented}
	for _, k := range kinds {
		orig := fmt.Errorf("sandbox x: %w", k)
		got := FromConnect(ToConnect(orig))
		if !errors.Is(got, k) {
			t.Errorf("%v came back as %v", k, got)
		}
		if strings.Count(got.Error(), k.Error()) != 1 {
			t.Errorf("kind repeated in %q", got.Error())
		}
	}
	if err := FromConnect(errors.New("dial tcp: refused")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("transport error: %v", err)
	}
	if FromConnect(nil) != nil || ToConnect(nil) != nil {
		t.Error("nil must stay nil")
	}
}

// Package nodeapi carries Cube's control-plane <-> node protocol
// (api/node/v1) over Connect: the CubeletService handler that wraps a
// cubelet, a client for it, and the error mapping between errdefs kinds and
// Connect codes, applied once on each side of the wire.
package nodeapi

import (
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/cube-dev/cube/internal/errdefs"
)

var codeOf = []struct {
	kind error
	code connect.Code
}{
	{errdefs.ErrNotFound, connect.CodeNotFound},
	{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
	{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
	{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
	{errdefs.ErrConflict, connect.CodeAborted},
	{errdefs.ErrUnavailable, connect.CodeUnavailable},
	{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted},
	{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
	{errdefs.ErrPermissionDenied, connect.CodePermissionDenied},
	{errdefs.ErrNotImplemented, connect.CodeUnimplemented},
}

// ToConnect maps an error to a Connect error carrying the matching code.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range codeOf {
		if errors.Is(err, c.kind) {
			return connect.NewError(c.code, err)
		}
	}
	return connect.NewError(connect.CodeInternal, err)
}

// FromConnect maps a Connect error back to an errdefs kind, keeping the
// remote message. Transport failures become ErrUnavailable.
func FromConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	for _, c := range codeOf {
		if ce.Code() == c.code {
			// The remote message usually ends with the kind already.
			msg := strings.TrimSuffix(ce.Message(), ": "+c.kind.Error())
			return fmt.Errorf("%s: %w", msg, c.kind)
		}
	}
	if ce.Code() == connect.CodeDeadlineExceeded || ce.Code() == connect.CodeCanceled {
		return fmt.Errorf("%s: %w", ce.Message(), errdefs.ErrUnavailable)
	}
	return errors.New(ce.Message())
}

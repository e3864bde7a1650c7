package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestCode(t *testing.T) {
	cases := []struct {
		err  error
		want connect.Code
	}{
		{fmt.Errorf("x: %w", errdefs.ErrNotFound), connect.CodeNotFound},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, connect.CodeNotFound},
		{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
		{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
		{syscall.ENOTDIR, connect.CodeInvalidArgument},
		{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
		{fs.ErrPermission, connect.CodePermissionDenied},
		{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
		{syscall.ENOSPC, connect.CodeResourceExhausted},
		{errdefs.ErrUnavailable, connect.CodeUnavailable},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{context.Canceled, connect.CodeCanceled},
		{connect.NewError(connect.CodeAborted, errors.New("a")), connect.CodeAborted},
		{errors.New("boom"), connect.CodeInternal},
	}
	for _, c := range cases {
		if got := Code(c.err); got != c.want {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.want)
		}
		if got := connect.CodeOf(From(c.err)); got != c.want {
			t.Errorf("From(%v) code = %v", c.err, got)
		}
	}
	if From(nil) != nil {
		t.Error("From(nil) != nil")
	}
}

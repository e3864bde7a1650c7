// Package rpcerr maps Cube error kinds (internal/errdefs) and filesystem
// errors to Connect error codes, once, at the RPC boundary.
package rpcerr

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"connectrpc.com/connect"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Code returns the Connect code for err.
func Code(err error) connect.Code {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce.Code()
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return connect.CodeNotFound
	case errors.Is(err, errdefs.ErrAlreadyExists), errors.Is(err, fs.ErrExist):
		return connect.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG):
		return connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrFailedPrecondition), errors.Is(err, errdefs.ErrConflict),
		errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EXDEV):
		return connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrPermissionDenied), errors.Is(err, fs.ErrPermission):
		return connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return connect.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrResourceExhausted), errors.Is(err, syscall.ENOSPC):
		return connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		return connect.CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	default:
		return connect.CodeInternal
	}
}

// From converts err to a *connect.Error with the mapped code; nil stays nil.
func From(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(Code(err), err)
}

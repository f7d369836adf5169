package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The client's errors carry a gRPC status, so that status.Code(err) tells
// them apart, and wrap the standard error that the code stands for, so
// that errors.Is works as it does with os.File:
//
//	NOT_FOUND                          fs.ErrNotExist
//	ALREADY_EXISTS                     fs.ErrExist
//	PERMISSION_DENIED, UNAUTHENTICATED fs.ErrPermission
//	CANCELED                           context.Canceled
//	DEADLINE_EXCEEDED                  context.DeadlineExceeded
//	a call on a closed File or Client  fs.ErrClosed
//
// (Like status.FromContextError, a context's end maps to CANCELED or
// DEADLINE_EXCEEDED.)

// statusError is an error of the client: a gRPC status, and the standard
// errors it wraps.
type statusError struct {
	st   *status.Status
	errs []error // what errors.Is matches besides the error itself
}

func (e *statusError) Error() string { return e.st.Err().Error() }

// GRPCStatus makes status.Code and status.FromError see the status.
func (e *statusError) GRPCStatus() *status.Status { return e.st }

func (e *statusError) Unwrap() []error { return e.errs }

// sentinelOf is the standard error that code stands for, or nil.
func sentinelOf(code codes.Code) error {
	switch code {
	case codes.NotFound:
		return fs.ErrNotExist
	case codes.AlreadyExists:
		return fs.ErrExist
	case codes.PermissionDenied, codes.Unauthenticated:
		return fs.ErrPermission
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	}
	return nil
}

// wrapErr makes err, from gRPC or a context, an error of the client: it
// keeps its status (a context error becomes CANCELED or
// DEADLINE_EXCEEDED) and wraps the sentinel of its code. nil stays nil,
// and an error of the client stays as it is.
func wrapErr(err error) error {
	if err == nil {
		return nil
	}
	var se *statusError
	if errors.As(err, &se) {
		return err
	}
	var st *status.Status
	var cause error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
			st = s
		} else {
			st = status.FromContextError(err)
			cause = err // the context's error itself, with its cause
		}
	default:
		st = status.Convert(err)
	}
	e := &statusError{st: st}
	if cause != nil {
		e.errs = append(e.errs, cause)
	} else if s := sentinelOf(st.Code()); s != nil {
		e.errs = append(e.errs, s)
	}
	return e
}

// newError is an error of the client with code and a message, wrapping
// extra besides the sentinel of code.
func newError(code codes.Code, extra error, format string, args ...any) error {
	e := &statusError{st: status.New(code, "filewrite client: "+fmt.Sprintf(format, args...))}
	if extra != nil {
		e.errs = append(e.errs, extra)
	}
	if s := sentinelOf(code); s != nil {
		e.errs = append(e.errs, s)
	}
	return e
}

// errFileClosed is what calls on a closed File fail with, a second Close
// included.
func errFileClosed(path string) error {
	return newError(codes.FailedPrecondition, fs.ErrClosed, "%s: file already closed", path)
}

// errClientClosed is what calls on a closed Client fail with, and the
// writes that a Client's Close cut short.
var errClientClosed = newError(codes.Canceled, fs.ErrClosed, "client closed")

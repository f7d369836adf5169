package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWrapErr: every error of the client keeps its gRPC code and wraps the
// standard error that code stands for, also when wrapped again by the
// caller; a context's end becomes its code and wraps the context's error.
func TestWrapErr(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode codes.Code
		wantIs   []error // each must match
		wantNot  []error // none may
	}{
		{"not found", status.Error(codes.NotFound, "x"), codes.NotFound, []error{fs.ErrNotExist}, []error{fs.ErrExist}},
		{"already exists", status.Error(codes.AlreadyExists, "x"), codes.AlreadyExists, []error{fs.ErrExist}, []error{fs.ErrNotExist}},
		{"permission denied", status.Error(codes.PermissionDenied, "x"), codes.PermissionDenied, []error{fs.ErrPermission}, nil},
		{"unauthenticated", status.Error(codes.Unauthenticated, "x"), codes.Unauthenticated, []error{fs.ErrPermission}, nil},
		{"canceled status", status.Error(codes.Canceled, "x"), codes.Canceled, []error{context.Canceled}, []error{context.DeadlineExceeded}},
		{"deadline status", status.Error(codes.DeadlineExceeded, "x"), codes.DeadlineExceeded, []error{context.DeadlineExceeded}, []error{context.Canceled}},
		{"context canceled", context.Canceled, codes.Canceled, []error{context.Canceled}, nil},
		{"context deadline", fmt.Errorf("waiting: %w", context.DeadlineExceeded), codes.DeadlineExceeded, []error{context.DeadlineExceeded}, nil},
		{"unavailable", status.Error(codes.Unavailable, "x"), codes.Unavailable, nil, []error{fs.ErrNotExist, context.Canceled, fs.ErrClosed}},
		{"unknown error", errors.New("boom"), codes.Unknown, nil, []error{fs.ErrNotExist, context.Canceled}},
		{"closed file", errFileClosed("f"), codes.FailedPrecondition, []error{fs.ErrClosed}, []error{context.Canceled}},
		{"closed client", errClientClosed, codes.Canceled, []error{fs.ErrClosed, context.Canceled}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, err := range []error{wrapErr(tt.err), fmt.Errorf("caller: %w", wrapErr(tt.err))} {
				if got := status.Code(err); got != tt.wantCode {
					t.Errorf("status.Code(%v): got %v, want %v", err, got, tt.wantCode)
				}
				for _, target := range tt.wantIs {
					if !errors.Is(err, target) {
						t.Errorf("errors.Is(%v, %v): got false, want true", err, target)
					}
				}
				for _, target := range tt.wantNot {
					if errors.Is(err, target) {
						t.Errorf("errors.Is(%v, %v): got true, want false", err, target)
					}
				}
			}
		})
	}
	if wrapErr(nil) != nil {
		t.Error("wrapErr(nil): got an error, want nil")
	}
}

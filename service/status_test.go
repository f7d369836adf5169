package service

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/store"
)

func TestToStatus(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("write a/b at 4096: %w", err) }
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"invalid path", wrap(store.ErrInvalidPath), codes.InvalidArgument},
		{"path too long", wrap(store.ErrPathTooLong), codes.InvalidArgument},
		{"path escapes", wrap(store.ErrPathEscapes), codes.InvalidArgument},
		{"is a directory", wrap(store.ErrIsDirectory), codes.InvalidArgument},
		{"not a regular file", wrap(store.ErrNotRegular), codes.InvalidArgument},
		{"invalid offset", wrap(store.ErrInvalidOffset), codes.InvalidArgument},
		{"invalid mode", wrap(store.ErrInvalidMode), codes.InvalidArgument},
		{"not found", wrap(store.ErrNotFound), codes.NotFound},
		{"deleted under a handle", wrap(store.ErrDeleted), codes.NotFound},
		{"exists", wrap(store.ErrExists), codes.AlreadyExists},
		{"invalid page", wrap(store.ErrInvalidPage), codes.InvalidArgument},
		{"file too large", wrap(store.ErrFileTooLarge), codes.ResourceExhausted},
		{"request too large", wrap(store.ErrRequestTooLarge), codes.ResourceExhausted},
		{"no space", wrap(store.ErrNoSpace), codes.ResourceExhausted},
		{"too many open files", wrap(store.ErrTooManyOpenFiles), codes.ResourceExhausted},
		{"out of descriptors", wrap(store.ErrNoDescriptors), codes.ResourceExhausted},
		{"too many waiters", wrap(store.ErrTooManyWaiters), codes.ResourceExhausted},
		{"unsupported", wrap(store.ErrUnsupported), codes.FailedPrecondition},
		{"closed", wrap(store.ErrClosed), codes.Unavailable},
		{"sync failed", wrap(store.ErrSyncFailed), codes.DataLoss},
		{"file removed from outside", wrap(store.ErrFileRemoved), codes.DataLoss},
		{"sync failed for lack of space", errors.Join(store.ErrSyncFailed, store.ErrNoSpace), codes.DataLoss},
		{"canceled", wrap(context.Canceled), codes.Canceled},
		{"deadline", wrap(context.DeadlineExceeded), codes.DeadlineExceeded},
		{"canceled while waiting for a lock", fmt.Errorf("%w: %w", store.ErrTooManyWaiters, context.Canceled), codes.Canceled},
		{"already a status", status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied},
		{"unknown error", errors.New("disk on fire"), codes.Internal},
		{"unknown wrapped errno", wrap(fs.ErrPermission), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := toStatus(tt.err)
			if (got == nil) != (tt.err == nil) {
				t.Fatalf("toStatus(%v) = %v, want nil exactly when the error is nil", tt.err, got)
			}
			if code := status.Code(got); code != tt.want {
				t.Errorf("toStatus(%v) code = %v, want %v", tt.err, code, tt.want)
			}
			if tt.err != nil {
				if msg := status.Convert(got).Message(); msg != tt.err.Error() && status.Code(tt.err) == codes.Unknown {
					t.Errorf("toStatus(%v) message = %q, want the error's own text", tt.err, msg)
				}
			}
		})
	}
}

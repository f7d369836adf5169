package status

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/store"
)

// TestToStatus: each error becomes the code and the ErrorInfo reason of
// its kind, with the error's own text as the message (a limit's flag
// added), an unknown error INTERNAL, and a status passes as it is.
func TestToStatus(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("write a/b at 4096: %w", err) }
	tests := []struct {
		name   string
		err    error
		want   codes.Code
		reason string
	}{
		{"nil", nil, codes.OK, ""},
		{"invalid path", wrap(store.ErrInvalidPath), codes.InvalidArgument, "PATH_INVALID"},
		{"path too long", wrap(store.ErrPathTooLong), codes.InvalidArgument, "PATH_TOO_LONG"},
		{"path escapes", wrap(store.ErrPathEscapes), codes.InvalidArgument, "PATH_ESCAPES_ROOT"},
		{"is a directory", wrap(store.ErrIsDirectory), codes.InvalidArgument, "IS_A_DIRECTORY"},
		{"not a regular file", wrap(store.ErrNotRegular), codes.InvalidArgument, "NOT_A_REGULAR_FILE"},
		{"invalid offset", wrap(store.ErrInvalidOffset), codes.InvalidArgument, "RANGE_INVALID"},
		{"argument too long", wrap(store.ErrArgumentTooLong), codes.InvalidArgument, "REQUEST_MALFORMED"},
		{"invalid mode", wrap(store.ErrInvalidMode), codes.InvalidArgument, "MODE_INVALID"},
		{"not found", wrap(store.ErrNotFound), codes.NotFound, "FILE_NOT_FOUND"},
		{"deleted under a handle", wrap(store.ErrDeleted), codes.NotFound, "FILE_DELETED"},
		{"exists", wrap(store.ErrExists), codes.AlreadyExists, "ALREADY_EXISTS"},
		{"invalid page", wrap(store.ErrInvalidPage), codes.InvalidArgument, "PAGE_INVALID"},
		{"file too large", wrap(store.ErrFileTooLarge), codes.OutOfRange, "FILE_TOO_LARGE"},
		{"request too large", wrap(store.ErrRequestTooLarge), codes.InvalidArgument, "REQUEST_TOO_LARGE"},
		{"no space", wrap(store.ErrNoSpace), codes.ResourceExhausted, "NO_SPACE"},
		{"too many open files", wrap(store.ErrTooManyOpenFiles), codes.ResourceExhausted, "TOO_MANY_OPEN_FILES"},
		{"out of descriptors", wrap(store.ErrNoDescriptors), codes.ResourceExhausted, "NO_DESCRIPTORS"},
		{"too many waiters", wrap(store.ErrTooManyWaiters), codes.ResourceExhausted, "TOO_MANY_WAITERS"},
		{"unsupported", wrap(store.ErrUnsupported), codes.FailedPrecondition, "UNSUPPORTED_BY_FILESYSTEM"},
		{"closed", wrap(store.ErrClosed), codes.Unavailable, "SHUTTING_DOWN"},
		{"sync failed", wrap(store.ErrSyncFailed), codes.DataLoss, "SYNC_FAILED"},
		{"file removed from outside", wrap(store.ErrFileRemoved), codes.DataLoss, "FILE_REMOVED_OUTSIDE"},
		{"file cut from outside", wrap(store.ErrChangedOutside), codes.DataLoss, "FILE_CHANGED_OUTSIDE"},
		{"sync failed for lack of space", errors.Join(store.ErrSyncFailed, store.ErrNoSpace), codes.DataLoss, "SYNC_FAILED"},
		{"canceled", wrap(context.Canceled), codes.Canceled, "CANCELLED"},
		{"deadline", wrap(context.DeadlineExceeded), codes.DeadlineExceeded, "DEADLINE_EXCEEDED"},
		{"deadline waiting for the budget", &BudgetWaitError{Capacity: 10, Err: context.DeadlineExceeded}, codes.DeadlineExceeded, "INFLIGHT_BUDGET"},
		{"canceled while waiting for a lock", fmt.Errorf("%w: %w", store.ErrTooManyWaiters, context.Canceled), codes.Canceled, "CANCELLED"},
		{"already a status", grpcstatus.Error(codes.PermissionDenied, "no"), codes.PermissionDenied, ""},
		{"a status of the transport", grpcstatus.Error(codes.Unavailable, "closing"), codes.Unavailable, "SHUTTING_DOWN"},
		{"unknown error", errors.New("disk on fire"), codes.Internal, "IO_ERROR"},
		{"unknown wrapped errno", wrap(fs.ErrPermission), codes.Internal, "IO_ERROR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Of(tt.err)
			if (got == nil) != (tt.err == nil) {
				t.Fatalf("toStatus(%v) = %v, want nil exactly when the error is nil", tt.err, got)
			}
			if code := grpcstatus.Code(got); code != tt.want {
				t.Errorf("toStatus(%v) code = %v, want %v", tt.err, code, tt.want)
			}
			if reason := errorinfo.Reason(got); reason != tt.reason {
				t.Errorf("toStatus(%v) reason = %q, want %q", tt.err, reason, tt.reason)
			}
			if tt.err != nil {
				if msg := grpcstatus.Convert(got).Message(); !strings.HasPrefix(msg, grpcstatus.Convert(tt.err).Message()) {
					t.Errorf("toStatus(%v) message = %q, want the error's own text first", tt.err, msg)
				}
			}
		})
	}
}

// TestRefusalDetails: a limit's refusal names the limit and its flag in
// the ErrorInfo and the message; an argument's refusal names the field in
// a BadRequest; a refusal that passes with time says when to retry; the
// filesystem's own size limit names no flag.
func TestRefusalDetails(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		md        map[string]string
		field     string
		retry     bool
		msgSuffix string
	}{
		{
			name:      "file size limit",
			err:       &store.Refusal{Err: store.ErrFileTooLarge, Arg: "size", Limit: 1 << 20, Detail: "size 1048577"},
			md:        map[string]string{"limit": "1048576", "flag": "--max-file-size", "field": "size"},
			msgSuffix: " (--max-file-size)",
		},
		{
			name: "the filesystem's file size limit",
			err:  fmt.Errorf("%w: write a: %w", store.ErrFileTooLarge, syscall.EFBIG),
			md:   map[string]string{},
		},
		{
			name:      "request size",
			err:       &store.Refusal{Err: store.ErrRequestTooLarge, Arg: "data", Limit: 4096, Detail: "4097 bytes"},
			md:        map[string]string{"limit": "4096", "flag": "--max-request-bytes", "field": "data"},
			field:     "data",
			msgSuffix: " (--max-request-bytes)",
		},
		{
			name:      "waiters",
			err:       &store.Refusal{Err: store.ErrTooManyWaiters, Limit: 2, Detail: "2 callers"},
			md:        map[string]string{"limit": "2", "flag": "--max-waiters-per-file"},
			retry:     true,
			msgSuffix: " (--max-waiters-per-file)",
		},
		{
			name:      "descriptors",
			err:       fmt.Errorf("%w: open a: %w", store.ErrNoDescriptors, syscall.EMFILE),
			md:        map[string]string{"limit": strconv.FormatUint(store.NoFileLimit(), 10), "flag": "--max-open-files", "rlimit": "RLIMIT_NOFILE"},
			retry:     true,
			msgSuffix: " (--max-open-files)",
		},
		{
			name:  "path",
			err:   &store.Refusal{Err: store.ErrInvalidPath, Arg: "new_path", Detail: "empty"},
			md:    map[string]string{"field": "new_path"},
			field: "new_path",
		},
		{
			name: "no space: not before someone frees some",
			err:  fmt.Errorf("%w: write a", store.ErrNoSpace),
			md:   map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Of(tt.err)
			info := errorinfo.From(got)
			if info == nil {
				t.Fatalf("toStatus(%v) = %v: no ErrorInfo", tt.err, got)
			}
			if info.GetDomain() != errorinfo.Domain {
				t.Errorf("domain = %q, want %q", info.GetDomain(), errorinfo.Domain)
			}
			if md := info.GetMetadata(); !maps.Equal(md, tt.md) && !(len(md) == 0 && len(tt.md) == 0) {
				t.Errorf("metadata = %v, want %v", md, tt.md)
			}
			var field string
			var retry bool
			for _, d := range grpcstatus.Convert(got).Details() {
				switch d := d.(type) {
				case *errdetails.BadRequest:
					field = d.GetFieldViolations()[0].GetField()
				case *errdetails.RetryInfo:
					retry = d.GetRetryDelay().AsDuration() > 0
				}
			}
			if field != tt.field {
				t.Errorf("BadRequest field = %q, want %q", field, tt.field)
			}
			if retry != tt.retry {
				t.Errorf("RetryInfo given: %v, want %v", retry, tt.retry)
			}
			if msg := grpcstatus.Convert(got).Message(); msg != tt.err.Error()+tt.msgSuffix {
				t.Errorf("message = %q, want %q", msg, tt.err.Error()+tt.msgSuffix)
			}
		})
	}
}

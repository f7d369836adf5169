package client_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/service"
)

// TestReason: the reason of a refusal reaches the caller of WriteAt (from
// a WriteStream ack) and of a unary call, also when the error is wrapped;
// errors the daemon did not make have none.
func TestReason(t *testing.T) {
	d := startDaemon(t, func(c *service.Config) { c.Store.MaxFileSize = 1 << 20 })
	ctx := testContext(t)
	c := dial(t, d.addr)
	f := openFile(t, ctx, c, "reason/f")
	defer f.Close()
	_, streamErr := f.WriteAt([]byte("x"), 1<<40)
	unaryErr := f.Truncate(ctx, -1)
	tests := []struct {
		name  string
		err   error
		want  string
		limit string
	}{
		{"stream ack", streamErr, filewritev1.ErrorReason_FILE_TOO_LARGE.String(), "1048576"},
		{"wrapped", fmt.Errorf("saving: %w", streamErr), filewritev1.ErrorReason_FILE_TOO_LARGE.String(), "1048576"},
		{"unary", unaryErr, filewritev1.ErrorReason_RANGE_INVALID.String(), ""},
		{"a status of no reason", status.Error(codes.Unavailable, "connection refused"), "", ""},
		{"not a status", errors.New("x"), "", ""},
		{"nil", nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := client.Reason(tt.err); got != tt.want {
				t.Errorf("Reason(%v) = %q, want %q", tt.err, got, tt.want)
			}
			if got := client.ErrorMetadata(tt.err)["limit"]; got != tt.limit {
				t.Errorf("ErrorMetadata(%v)[limit] = %q, want %q", tt.err, got, tt.limit)
			}
		})
	}
}

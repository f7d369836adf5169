package errorinfo_test

import (
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/internal/errorinfo"
)

func withInfo(domain, reason string) error {
	st, err := status.New(codes.OutOfRange, "x").WithDetails(
		&errdetails.RetryInfo{},
		&errdetails.ErrorInfo{Domain: domain, Reason: reason})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// TestReason: only an ErrorInfo of the daemon's domain gives a reason,
// wherever it sits among the details and however the status is wrapped.
func TestReason(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"not a status", fmt.Errorf("plain"), ""},
		{"a status without details", status.Error(codes.Unavailable, "down"), ""},
		{"the daemon's", withInfo(errorinfo.Domain, "FILE_TOO_LARGE"), "FILE_TOO_LARGE"},
		{"wrapped", fmt.Errorf("save: %w", withInfo(errorinfo.Domain, "NO_SPACE")), "NO_SPACE"},
		{"another domain's", withInfo("googleapis.com", "RATE_LIMIT_EXCEEDED"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errorinfo.Reason(tt.err); got != tt.want {
				t.Errorf("Reason(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

// Package errorinfo holds what the daemon and the Go client share about
// the google.rpc.ErrorInfo that every status of the daemon carries: its
// domain, and how to read the reason back from an error. The reasons
// themselves are the API's (filewritev1.ErrorReason), so that clients in
// other languages see them too; docs/errors.md lists them.
package errorinfo

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of the daemon's reasons: the module's
// path, which no other project can claim. A reason is only the daemon's
// when its domain is this one.
const Domain = "github.com/filewrite/filewrite"

// Metadata keys of the daemon's ErrorInfo.
const (
	// KeyLimit is the limit that refused the request, as a decimal number
	// in the limit's unit (bytes, files, callers).
	KeyLimit = "limit"
	// KeyFlag is the daemon's command-line flag that sets the limit, such
	// as "--max-file-size".
	KeyFlag = "flag"
	// KeyField is the request field at fault, such as "offset"; the
	// BadRequest detail names it too.
	KeyField = "field"
	// KeyGeneration is the file's generation, in decimal ("0": no file),
	// in the refusal of a failed precondition.
	KeyGeneration = "generation"
)

// From returns the daemon's ErrorInfo in err's status, or nil when err is
// not a status or its status carries none of the daemon's domain.
func From(err error) *errdetails.ErrorInfo {
	var se interface{ GRPCStatus() *status.Status }
	if err == nil || !errors.As(err, &se) {
		return nil
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info
		}
	}
	return nil
}

// Reason returns the reason of the daemon's ErrorInfo in err's status, or
// "" when there is none.
func Reason(err error) string {
	return From(err).GetReason()
}

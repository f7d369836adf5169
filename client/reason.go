package client

import (
	"github.com/filewrite/filewrite/internal/errorinfo"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the daemon's reasons.
const ErrorDomain = errorinfo.Domain

// Reason returns the reason the daemon gave for err: the
// google.rpc.ErrorInfo reason of its status, one of the names of
// filewritev1.ErrorReason (such as "FILE_TOO_LARGE" or "TOO_MANY_WAITERS"),
// or "" when the daemon sent none (a status made by gRPC itself or by this
// package, or an error that is no status). Branch on it rather than on the
// message, whose text may change:
//
//	if client.Reason(err) == filewritev1.ErrorReason_FILE_TOO_LARGE.String() {
//		// split the file
//	}
//
// docs/errors.md lists the reasons, their codes, and whether to retry.
func Reason(err error) string {
	return errorinfo.Reason(err)
}

// ErrorMetadata returns the metadata of the daemon's ErrorInfo in err, such
// as "limit" and "flag" of a limit that refused it, or nil when there is
// none. The caller must not change it.
func ErrorMetadata(err error) map[string]string {
	return errorinfo.From(err).GetMetadata()
}

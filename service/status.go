package service

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/store"
)

// reasonRule is what a status of one ErrorReason carries besides its
// message: the gRPC code (and through it the HTTP status), the delay its
// RetryInfo suggests (none: retrying does not help, or not before someone
// acts), the flag that sets the limit it reports, and the field it blames
// by default. docs/errors.md is
// this table for readers; TestErrorsTable keeps the two in step.
type reasonRule struct {
	code  codes.Code
	retry time.Duration
	flag  string
	// field is the request field to name when the error does not say
	// (a path that open(2) refused).
	field string
}

// reasonRules has every reason the daemon returns. A request that can
// never succeed as it is gets a code that clients do not retry (AIP-193:
// INVALID_ARGUMENT, OUT_OF_RANGE); RESOURCE_EXHAUSTED is kept for what
// passes with time, and those of them that pass on their own say when to
// try again.
var reasonRules = map[filewritev1.ErrorReason]reasonRule{
	filewritev1.ErrorReason_PATH_INVALID:        {code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_PATH_TOO_LONG:       {code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_PATH_ESCAPES_ROOT:   {code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_IS_A_DIRECTORY:      {code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_NOT_A_REGULAR_FILE:  {code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_RANGE_INVALID:       {code: codes.InvalidArgument},
	filewritev1.ErrorReason_MODE_INVALID:        {code: codes.InvalidArgument},
	filewritev1.ErrorReason_PAGE_INVALID:        {code: codes.InvalidArgument},
	filewritev1.ErrorReason_REQUEST_MALFORMED:   {code: codes.InvalidArgument},
	filewritev1.ErrorReason_REQUEST_TOO_LARGE:   {code: codes.InvalidArgument, flag: "--max-request-bytes"},
	filewritev1.ErrorReason_CRC_MISMATCH:        {code: codes.InvalidArgument},
	filewritev1.ErrorReason_WRITE_ID_IN_USE:     {code: codes.InvalidArgument},
	filewritev1.ErrorReason_STREAM_PATH_CHANGED: {code: codes.InvalidArgument},
	filewritev1.ErrorReason_APPEND_ID_REUSED:    {code: codes.InvalidArgument, field: "append_id"},

	filewritev1.ErrorReason_PATH_HEADER_MISMATCH:   {code: codes.FailedPrecondition},
	filewritev1.ErrorReason_APPEND_OFFSET_MISMATCH: {code: codes.FailedPrecondition},

	filewritev1.ErrorReason_FILE_TOO_LARGE: {code: codes.OutOfRange, flag: "--max-file-size"},

	filewritev1.ErrorReason_FILE_NOT_FOUND: {code: codes.NotFound},
	filewritev1.ErrorReason_FILE_DELETED:   {code: codes.NotFound},
	filewritev1.ErrorReason_ALREADY_EXISTS: {code: codes.AlreadyExists},

	filewritev1.ErrorReason_TOO_MANY_OPEN_FILES:      {code: codes.ResourceExhausted, retry: 100 * time.Millisecond, flag: "--max-open-files"},
	filewritev1.ErrorReason_TOO_MANY_WAITERS:         {code: codes.ResourceExhausted, retry: 100 * time.Millisecond, flag: "--max-waiters-per-file"},
	filewritev1.ErrorReason_TOO_MANY_FILES_ON_STREAM: {code: codes.ResourceExhausted, flag: "--max-files-per-stream"},
	filewritev1.ErrorReason_NO_DESCRIPTORS:           {code: codes.ResourceExhausted, retry: time.Second, flag: "--max-open-files"},
	filewritev1.ErrorReason_NO_SPACE:                 {code: codes.ResourceExhausted},

	filewritev1.ErrorReason_UNSUPPORTED_BY_FILESYSTEM: {code: codes.FailedPrecondition},

	filewritev1.ErrorReason_SYNC_FAILED:          {code: codes.DataLoss},
	filewritev1.ErrorReason_FILE_REMOVED_OUTSIDE: {code: codes.DataLoss},
	filewritev1.ErrorReason_FILE_CHANGED_OUTSIDE: {code: codes.DataLoss},
	filewritev1.ErrorReason_IO_ERROR:             {code: codes.Internal},

	filewritev1.ErrorReason_TOKEN_MISSING: {code: codes.Unauthenticated},
	filewritev1.ErrorReason_TOKEN_INVALID: {code: codes.Unauthenticated},
	filewritev1.ErrorReason_TOKEN_REVOKED: {code: codes.Unauthenticated},

	filewritev1.ErrorReason_TOO_MANY_WRITES_IN_MESSAGE: {code: codes.InvalidArgument, field: "writes"},

	filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE: {code: codes.PermissionDenied, flag: "--auth-token-file"},

	filewritev1.ErrorReason_SHUTTING_DOWN: {code: codes.Unavailable, retry: time.Second},
	// Nothing is wrong and nothing was lost: open a new stream at once,
	// which the least RetryInfo says.
	filewritev1.ErrorReason_STREAM_IDLE: {code: codes.Unavailable, retry: time.Millisecond, flag: "--stream-idle-timeout"},

	filewritev1.ErrorReason_CANCELLED:         {code: codes.Canceled},
	filewritev1.ErrorReason_DEADLINE_EXCEEDED: {code: codes.DeadlineExceeded},
	filewritev1.ErrorReason_INFLIGHT_BUDGET:   {code: codes.DeadlineExceeded, retry: time.Second, flag: "--max-inflight-bytes"},
	filewritev1.ErrorReason_BODY_TIMEOUT:      {code: codes.DeadlineExceeded, flag: "--body-timeout"},

	// REST only (gatewaymedia.go, gatewaystream.go, gatewaybrowser.go).
	filewritev1.ErrorReason_PRECONDITION_FAILED:   {code: codes.FailedPrecondition},
	filewritev1.ErrorReason_ETAG_MISMATCH:         {code: codes.FailedPrecondition},
	filewritev1.ErrorReason_RANGE_NOT_SATISFIABLE: {code: codes.OutOfRange},
	filewritev1.ErrorReason_ORIGIN_NOT_ALLOWED:    {code: codes.PermissionDenied, flag: "--http-allowed-origins"},
	filewritev1.ErrorReason_HOST_NOT_ALLOWED:      {code: codes.PermissionDenied, flag: "--http-allowed-hosts"},
}

// refusal is the status of a refusal for reason: the code of its rule, a
// google.rpc.ErrorInfo with md as metadata (the rule's flag added), a
// google.rpc.BadRequest naming md's "field" for INVALID_ARGUMENT, and a
// google.rpc.RetryInfo when the rule says to retry.
func refusal(reason filewritev1.ErrorReason, md map[string]string, format string, a ...any) error {
	return newRefusal(reason, md, fmt.Sprintf(format, a...)).Err()
}

func newRefusal(reason filewritev1.ErrorReason, md map[string]string, msg string) *status.Status {
	return buildStatus(reason, md, msg, reasonRules[reason].flag)
}

// buildStatus is newRefusal with the flag to name in the metadata (none
// when "").
func buildStatus(reason filewritev1.ErrorReason, md map[string]string, msg, flag string) *status.Status {
	rule, ok := reasonRules[reason]
	if !ok {
		panic(fmt.Sprintf("service: no rule for ErrorReason %v", reason))
	}
	if flag != "" {
		if md == nil {
			md = make(map[string]string, 1)
		}
		md[errorinfo.KeyFlag] = flag
	}
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason.String(), Domain: errorinfo.Domain, Metadata: md}}
	if field := md[errorinfo.KeyField]; field != "" && rule.code == codes.InvalidArgument {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: field, Description: msg, Reason: reason.String()},
		}})
	}
	if rule.retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(rule.retry)})
	}
	st := status.New(rule.code, msg)
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		return st // cannot happen: the details are plain messages
	}
	return withDetails
}

// toStatus is the one place where the store's errors, and the handlers'
// own, become gRPC statuses (and, through the gateway, HTTP statuses), each
// with its ErrorReason (reasonOf). store wraps its sentinels with %w, so
// they are matched with errors.Is; the message keeps the whole chain, which
// names the path and the limit that was hit, and the flag that sets it.
// A *store.Refusal's argument and limit go into the ErrorInfo's metadata.
//
// Statuses that involve no store error are built with refusal where the
// request is refused: UNAUTHENTICATED in auth.go; the gateway's refusals
// of a path, query or body (gateway.go, gatewayinput.go, gatewaystream.go);
// a malformed message (codec.go); an Extents page_size or page_token
// (paging.go); and a WriteStream's own refusals and endings
// (writestream.go). A status that reaches toStatus without a reason (from
// the transport) gets the one its code implies (withReason).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		// Already a status (from the transport or a client call): keep it.
		return withReason(st).Err()
	}
	reason := reasonOf(err)
	md := map[string]string{}
	var r *store.Refusal
	if errors.As(err, &r) {
		if r.Arg != "" {
			md[errorinfo.KeyField] = r.Arg
		}
		if r.Limit > 0 {
			md[errorinfo.KeyLimit] = strconv.FormatInt(r.Limit, 10)
		}
	}
	if md[errorinfo.KeyField] == "" && reasonRules[reason].field != "" {
		md[errorinfo.KeyField] = reasonRules[reason].field
	}
	var bw *budgetWaitError
	var am *store.AppendMismatch
	switch {
	case reason == filewritev1.ErrorReason_APPEND_OFFSET_MISMATCH && errors.As(err, &am):
		md["size"] = strconv.FormatInt(am.End, 10)
	case reason == filewritev1.ErrorReason_INFLIGHT_BUDGET && errors.As(err, &bw):
		md[errorinfo.KeyLimit] = strconv.FormatInt(bw.capacity, 10)
	case reason == filewritev1.ErrorReason_NO_DESCRIPTORS && errors.Is(err, syscall.EMFILE):
		md["rlimit"] = "RLIMIT_NOFILE"
		md[errorinfo.KeyLimit] = strconv.FormatUint(min(store.NoFileLimit(), math.MaxInt64), 10)
	case reason == filewritev1.ErrorReason_NO_DESCRIPTORS:
		md["rlimit"] = "fs.file-max"
	}
	msg := err.Error()
	flag := reasonRules[reason].flag
	switch {
	case flag == "":
	case md[errorinfo.KeyLimit] != "" || reason == filewritev1.ErrorReason_NO_DESCRIPTORS:
		msg += " (" + flag + ")"
	default:
		// A limit not the daemon's: a file refused by the filesystem's
		// own size limit (EFBIG) names no flag.
		flag = ""
	}
	return buildStatus(reason, md, msg, flag).Err()
}

// reasonOf classifies an error that is not a status. The order matters
// where one error can match two cases: a failed sync is reported as
// SYNC_FAILED (DATA_LOSS) even when ENOSPC caused it, because the caller's
// earlier unsynced writes may be gone, which "no space" alone would hide;
// a context that ended while waiting for a lock is CANCELLED, not
// TOO_MANY_WAITERS.
func reasonOf(err error) filewritev1.ErrorReason {
	var bw *budgetWaitError
	switch {
	case errors.Is(err, context.Canceled):
		return filewritev1.ErrorReason_CANCELLED
	case errors.Is(err, context.DeadlineExceeded) && errors.As(err, &bw):
		return filewritev1.ErrorReason_INFLIGHT_BUDGET
	case errors.Is(err, context.DeadlineExceeded):
		return filewritev1.ErrorReason_DEADLINE_EXCEEDED
	case errors.Is(err, store.ErrInvalidPath):
		return filewritev1.ErrorReason_PATH_INVALID
	case errors.Is(err, store.ErrPathTooLong):
		return filewritev1.ErrorReason_PATH_TOO_LONG
	case errors.Is(err, store.ErrPathEscapes):
		return filewritev1.ErrorReason_PATH_ESCAPES_ROOT
	case errors.Is(err, store.ErrIsDirectory):
		return filewritev1.ErrorReason_IS_A_DIRECTORY
	case errors.Is(err, store.ErrNotRegular):
		return filewritev1.ErrorReason_NOT_A_REGULAR_FILE
	case errors.Is(err, store.ErrInvalidOffset):
		return filewritev1.ErrorReason_RANGE_INVALID
	case errors.Is(err, store.ErrArgumentTooLong):
		return filewritev1.ErrorReason_REQUEST_MALFORMED
	case errors.Is(err, store.ErrInvalidMode):
		return filewritev1.ErrorReason_MODE_INVALID
	case errors.Is(err, store.ErrInvalidPage):
		return filewritev1.ErrorReason_PAGE_INVALID
	case errors.Is(err, store.ErrAppendOffsetMismatch):
		return filewritev1.ErrorReason_APPEND_OFFSET_MISMATCH
	case errors.Is(err, store.ErrAppendIDReused):
		return filewritev1.ErrorReason_APPEND_ID_REUSED
	case errors.Is(err, store.ErrDeleted):
		return filewritev1.ErrorReason_FILE_DELETED
	case errors.Is(err, store.ErrNotFound):
		return filewritev1.ErrorReason_FILE_NOT_FOUND
	case errors.Is(err, store.ErrExists):
		return filewritev1.ErrorReason_ALREADY_EXISTS
	case errors.Is(err, store.ErrSyncFailed):
		return filewritev1.ErrorReason_SYNC_FAILED
	case errors.Is(err, store.ErrFileRemoved):
		return filewritev1.ErrorReason_FILE_REMOVED_OUTSIDE
	case errors.Is(err, store.ErrChangedOutside):
		return filewritev1.ErrorReason_FILE_CHANGED_OUTSIDE
	case errors.Is(err, store.ErrFileTooLarge):
		return filewritev1.ErrorReason_FILE_TOO_LARGE
	case errors.Is(err, store.ErrRequestTooLarge):
		return filewritev1.ErrorReason_REQUEST_TOO_LARGE
	case errors.Is(err, store.ErrNoSpace):
		return filewritev1.ErrorReason_NO_SPACE
	case errors.Is(err, store.ErrTooManyOpenFiles):
		return filewritev1.ErrorReason_TOO_MANY_OPEN_FILES
	case errors.Is(err, store.ErrNoDescriptors):
		// The daemon is up and serves the files it has open, and the
		// request changed nothing; UNAVAILABLE would say the daemon is
		// down, and send clients elsewhere or into retries that open
		// more connections, each a descriptor.
		return filewritev1.ErrorReason_NO_DESCRIPTORS
	case errors.Is(err, store.ErrTooManyWaiters):
		return filewritev1.ErrorReason_TOO_MANY_WAITERS
	case errors.Is(err, store.ErrUnsupported):
		return filewritev1.ErrorReason_UNSUPPORTED_BY_FILESYSTEM
	case errors.Is(err, store.ErrClosed):
		return filewritev1.ErrorReason_SHUTTING_DOWN
	}
	return filewritev1.ErrorReason_IO_ERROR
}

// codeReasons is the reason given to a status that came without one, by
// its code: statuses made by gRPC's transport or by grpc-gateway (a body
// that is not JSON) rather than by the daemon's code. Codes not here keep
// no reason (an unknown method or route).
var codeReasons = map[codes.Code]filewritev1.ErrorReason{
	codes.InvalidArgument:  filewritev1.ErrorReason_REQUEST_MALFORMED,
	codes.Canceled:         filewritev1.ErrorReason_CANCELLED,
	codes.DeadlineExceeded: filewritev1.ErrorReason_DEADLINE_EXCEEDED,
	codes.Unavailable:      filewritev1.ErrorReason_SHUTTING_DOWN,
	codes.Internal:         filewritev1.ErrorReason_IO_ERROR,
	codes.Unknown:          filewritev1.ErrorReason_IO_ERROR,
}

// withReason returns st, or, when it carries no ErrorInfo of the daemon's
// and its code implies a reason (codeReasons), st with that reason.
func withReason(st *status.Status) *status.Status {
	if st.Code() == codes.OK || errorinfo.From(st.Err()) != nil {
		return st
	}
	reason, ok := codeReasons[st.Code()]
	if !ok {
		return st
	}
	return newRefusal(reason, nil, st.Message())
}

// retryDelay returns the delay of err's RetryInfo, if its status has one.
func retryDelay(err error) (time.Duration, bool) {
	var he *runtime.HTTPStatusError
	if errors.As(err, &he) {
		err = he.Err
	}
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// budgetWaitError is the error of a request whose context ended while it
// waited for the in-flight budget: errors.Is matches the context's error.
type budgetWaitError struct {
	capacity int64
	err      error
}

func (e *budgetWaitError) Error() string {
	return fmt.Sprintf("waited for memory (%d bytes in flight at most): %v", e.capacity, e.err)
}

func (e *budgetWaitError) Unwrap() error { return e.err }

// The WriteStream's own refusals, kept here so that writestream.go only
// names them.

// checkCRC32C refuses data whose CRC-32C is not sent, the checksum that
// came with it in the request field field (CRC_MISMATCH), before the store
// sees it: a refused write or append writes nothing.
func checkCRC32C(data []byte, sent uint32, field string) error {
	sum := crc32.Checksum(data, castagnoli)
	if sum == sent {
		return nil
	}
	return refusal(filewritev1.ErrorReason_CRC_MISMATCH, map[string]string{
		errorinfo.KeyField: field,
		"crc32c_data":      fmt.Sprintf("%#08x", sum),
		"crc32c_sent":      fmt.Sprintf("%#08x", sent),
	}, "the CRC-32C of the data is %#08x, the write says %#08x: nothing written", sum, sent)
}

func writeIDInUse(id uint64) error {
	return refusal(filewritev1.ErrorReason_WRITE_ID_IN_USE, map[string]string{errorinfo.KeyField: "writes.id", "id": strconv.FormatUint(id, 10)},
		"write id %d is already in use by a write not yet acknowledged", id)
}

func tooManyFilesOnStream(limit int) error {
	return refusal(filewritev1.ErrorReason_TOO_MANY_FILES_ON_STREAM, map[string]string{errorinfo.KeyLimit: strconv.Itoa(limit), errorinfo.KeyField: "files"},
		"the stream holds %d declared files already: the limit is %d files per stream (--max-files-per-stream); close one on the stream, or open another stream", limit, limit)
}

func unknownStreamFile(index uint32) error {
	return refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "writes.file", "index": strconv.FormatUint(uint64(index), 10)},
		"a write names file %d, which is not on the stream: declare it first (files), or name the stream's path in its first message for index 0", index)
}

func messageTooLarge(size int, limit int64) error {
	return refusal(filewritev1.ErrorReason_REQUEST_TOO_LARGE, map[string]string{errorinfo.KeyLimit: strconv.FormatInt(limit, 10), errorinfo.KeyField: "writes"},
		"a message of %d bytes: the limit is %d (--max-request-bytes plus %d)", size, limit, messageOverhead)
}

func streamIdleStatus(timeout time.Duration) error {
	return refusal(filewritev1.ErrorReason_STREAM_IDLE, nil,
		"the stream was idle for %v (--stream-idle-timeout): every write it read was acknowledged; open a new stream to write again", timeout)
}

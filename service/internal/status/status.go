package status

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
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
	Code codes.Code
	// HTTP is the HTTP status REST answers, where the code's own (as
	// grpc-gateway maps it) is not the one HTTP has for the case; 0: the
	// code's.
	HTTP  int
	Retry time.Duration
	flag  string
	// field is the request field to name when the error does not say
	// (a path that open(2) refused).
	field string
}

// Rules has every reason the daemon returns. A request that can
// never succeed as it is gets a code that clients do not retry (AIP-193:
// INVALID_ARGUMENT, OUT_OF_RANGE); RESOURCE_EXHAUSTED is kept for what
// passes with time, and those of them that pass on their own say when to
// try again.
var Rules = map[filewritev1.ErrorReason]reasonRule{
	filewritev1.ErrorReason_PATH_INVALID:        {Code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_PATH_TOO_LONG:       {Code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_PATH_ESCAPES_ROOT:   {Code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_IS_A_DIRECTORY:      {Code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_NOT_A_REGULAR_FILE:  {Code: codes.InvalidArgument, field: "path"},
	filewritev1.ErrorReason_RANGE_INVALID:       {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_MODE_INVALID:        {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_PAGE_INVALID:        {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_REQUEST_MALFORMED:   {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_REQUEST_TOO_LARGE:   {Code: codes.InvalidArgument, flag: "--max-request-bytes"},
	filewritev1.ErrorReason_CRC_MISMATCH:        {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_WRITE_ID_IN_USE:     {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_STREAM_PATH_CHANGED: {Code: codes.InvalidArgument},
	filewritev1.ErrorReason_APPEND_ID_REUSED:    {Code: codes.InvalidArgument, field: "append_id"},

	filewritev1.ErrorReason_PATH_HEADER_MISMATCH:   {Code: codes.FailedPrecondition},
	filewritev1.ErrorReason_APPEND_OFFSET_MISMATCH: {Code: codes.FailedPrecondition},

	filewritev1.ErrorReason_FILE_TOO_LARGE: {Code: codes.OutOfRange, flag: "--max-file-size"},

	filewritev1.ErrorReason_FILE_NOT_FOUND: {Code: codes.NotFound},
	filewritev1.ErrorReason_FILE_DELETED:   {Code: codes.NotFound},
	filewritev1.ErrorReason_ALREADY_EXISTS: {Code: codes.AlreadyExists},

	filewritev1.ErrorReason_TOO_MANY_OPEN_FILES:      {Code: codes.ResourceExhausted, Retry: 100 * time.Millisecond, flag: "--max-open-files"},
	filewritev1.ErrorReason_TOO_MANY_WAITERS:         {Code: codes.ResourceExhausted, Retry: 100 * time.Millisecond, flag: "--max-waiters-per-file"},
	filewritev1.ErrorReason_TOO_MANY_FILES_ON_STREAM: {Code: codes.ResourceExhausted, flag: "--max-files-per-stream"},
	filewritev1.ErrorReason_NO_DESCRIPTORS:           {Code: codes.ResourceExhausted, Retry: time.Second, flag: "--max-open-files"},
	filewritev1.ErrorReason_NO_SPACE:                 {Code: codes.ResourceExhausted},

	filewritev1.ErrorReason_UNSUPPORTED_BY_FILESYSTEM: {Code: codes.FailedPrecondition},

	filewritev1.ErrorReason_SYNC_FAILED:          {Code: codes.DataLoss},
	filewritev1.ErrorReason_FILE_REMOVED_OUTSIDE: {Code: codes.DataLoss},
	filewritev1.ErrorReason_FILE_CHANGED_OUTSIDE: {Code: codes.DataLoss},
	filewritev1.ErrorReason_IO_ERROR:             {Code: codes.Internal},

	filewritev1.ErrorReason_TOKEN_MISSING: {Code: codes.Unauthenticated},
	filewritev1.ErrorReason_TOKEN_INVALID: {Code: codes.Unauthenticated},
	filewritev1.ErrorReason_TOKEN_REVOKED: {Code: codes.Unauthenticated},

	filewritev1.ErrorReason_TOO_MANY_WRITES_IN_MESSAGE: {Code: codes.InvalidArgument, field: "writes"},

	filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE: {Code: codes.PermissionDenied, flag: "--auth-token-file"},

	filewritev1.ErrorReason_SHUTTING_DOWN: {Code: codes.Unavailable, Retry: time.Second},
	// Nothing is wrong and nothing was lost: open a new stream at once,
	// which the least RetryInfo says.
	filewritev1.ErrorReason_STREAM_IDLE: {Code: codes.Unavailable, Retry: time.Millisecond, flag: "--stream-idle-timeout"},

	filewritev1.ErrorReason_CANCELLED:         {Code: codes.Canceled},
	filewritev1.ErrorReason_DEADLINE_EXCEEDED: {Code: codes.DeadlineExceeded},
	filewritev1.ErrorReason_INFLIGHT_BUDGET:   {Code: codes.DeadlineExceeded, Retry: time.Second, flag: "--max-inflight-bytes"},
	filewritev1.ErrorReason_BODY_TIMEOUT:      {Code: codes.DeadlineExceeded, flag: "--body-timeout"},

	// A failed precondition, on the generation over gRPC, an HTTP
	// condition over REST: 412 there, whichever face set it.
	filewritev1.ErrorReason_PRECONDITION_FAILED: {Code: codes.FailedPrecondition, HTTP: http.StatusPreconditionFailed},
	filewritev1.ErrorReason_ETAG_MISMATCH:       {Code: codes.FailedPrecondition, HTTP: http.StatusPreconditionFailed},

	// REST only (service/internal/gateway).
	filewritev1.ErrorReason_RANGE_NOT_SATISFIABLE: {Code: codes.OutOfRange},
	filewritev1.ErrorReason_ORIGIN_NOT_ALLOWED:    {Code: codes.PermissionDenied, flag: "--http-allowed-origins"},
	filewritev1.ErrorReason_HOST_NOT_ALLOWED:      {Code: codes.PermissionDenied, flag: "--http-allowed-hosts"},
	filewritev1.ErrorReason_METHOD_NOT_ALLOWED:    {Code: codes.Unimplemented},
	filewritev1.ErrorReason_ROUTE_NOT_FOUND:       {Code: codes.NotFound},
}

// Refusal is the status of a refusal for reason: the code of its rule, a
// google.rpc.ErrorInfo with md as metadata (the rule's flag added), a
// google.rpc.BadRequest naming md's "field" for INVALID_ARGUMENT, and a
// google.rpc.RetryInfo when the rule says to retry.
func Refusal(reason filewritev1.ErrorReason, md map[string]string, format string, a ...any) error {
	return NewRefusal(reason, md, fmt.Sprintf(format, a...)).Err()
}

// NewRefusal is Refusal's status, with msg as its message.
func NewRefusal(reason filewritev1.ErrorReason, md map[string]string, msg string) *grpcstatus.Status {
	return Build(reason, md, msg, Rules[reason].flag)
}

// Build is NewRefusal with the flag to name in the metadata (none
// when "").
func Build(reason filewritev1.ErrorReason, md map[string]string, msg, flag string) *grpcstatus.Status {
	rule, ok := Rules[reason]
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
	if field := md[errorinfo.KeyField]; field != "" && rule.Code == codes.InvalidArgument {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: field, Description: msg, Reason: reason.String()},
		}})
	}
	if rule.Retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(rule.Retry)})
	}
	st := grpcstatus.New(rule.Code, msg)
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		return st // cannot happen: the details are plain messages
	}
	return withDetails
}

// Of is the one place where the store's errors, and the handlers'
// own, become gRPC statuses (and, through the gateway, HTTP statuses), each
// with its ErrorReason (reasonOf). store wraps its sentinels with %w, so
// they are matched with errors.Is; the message keeps the whole chain, which
// names the path and the limit that was hit, and the flag that sets it.
// A *store.Refusal's argument and limit go into the ErrorInfo's metadata.
//
// Statuses that involve no store error are built with Refusal where the
// request is refused: UNAUTHENTICATED in service/internal/auth; the
// gateway's refusals of a path, query or body (service/internal/gateway);
// a malformed message, an Extents page_size or page_token, and a
// WriteStream's own refusals and endings (service/internal/rpc). A status
// that reaches Of without a reason (from the transport) gets the one its
// code implies (withReason).
func Of(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := grpcstatus.FromError(err); ok {
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
	if md[errorinfo.KeyField] == "" && Rules[reason].field != "" {
		md[errorinfo.KeyField] = Rules[reason].field
	}
	var bw *BudgetWaitError
	var am *store.AppendMismatch
	gm, mismatch := errIsMismatch(err)
	switch {
	case mismatch:
		mismatchMetadata(md, gm)
	case reason == filewritev1.ErrorReason_APPEND_OFFSET_MISMATCH && errors.As(err, &am):
		md["size"] = strconv.FormatInt(am.End, 10)
	case reason == filewritev1.ErrorReason_INFLIGHT_BUDGET && errors.As(err, &bw):
		md[errorinfo.KeyLimit] = strconv.FormatInt(bw.Capacity, 10)
	case reason == filewritev1.ErrorReason_NO_DESCRIPTORS && errors.Is(err, syscall.EMFILE):
		md["rlimit"] = "RLIMIT_NOFILE"
		md[errorinfo.KeyLimit] = strconv.FormatUint(min(store.NoFileLimit(), math.MaxInt64), 10)
	case reason == filewritev1.ErrorReason_NO_DESCRIPTORS:
		md["rlimit"] = "fs.file-max"
	}
	msg := err.Error()
	flag := Rules[reason].flag
	switch {
	case flag == "":
	case md[errorinfo.KeyLimit] != "" || reason == filewritev1.ErrorReason_NO_DESCRIPTORS:
		msg += " (" + flag + ")"
	default:
		// A limit not the daemon's: a file refused by the filesystem's
		// own size limit (EFBIG) names no flag.
		flag = ""
	}
	return Build(reason, md, msg, flag).Err()
}

// reasonOf classifies an error that is not a status. The order matters
// where one error can match two cases: a failed sync is reported as
// SYNC_FAILED (DATA_LOSS) even when ENOSPC caused it, because the caller's
// earlier unsynced writes may be gone, which "no space" alone would hide;
// a context that ended while waiting for a lock is CANCELLED, not
// TOO_MANY_WAITERS.
func reasonOf(err error) filewritev1.ErrorReason {
	var bw *BudgetWaitError
	if m, ok := errIsMismatch(err); ok {
		return mismatchReason(m)
	}
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
	case errors.Is(err, store.ErrArgumentTooLong), errors.Is(err, store.ErrInvalidContentType):
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
	case errors.Is(err, store.ErrNotEmpty):
		return filewritev1.ErrorReason_PRECONDITION_FAILED
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
// no reason (gRPC's own UNIMPLEMENTED for an unknown method).
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
func withReason(st *grpcstatus.Status) *grpcstatus.Status {
	if st.Code() == codes.OK || errorinfo.From(st.Err()) != nil {
		return st
	}
	reason, ok := codeReasons[st.Code()]
	if !ok {
		return st
	}
	return NewRefusal(reason, nil, st.Message())
}

// HTTPStatus is the HTTP status of err's reason where it is not the one
// its gRPC code implies (reasonRule.HTTP), for a status that is not
// already a *runtime.HTTPStatusError.
func HTTPStatus(err error) (int, bool) {
	info := errorinfo.From(err)
	if info == nil {
		return 0, false
	}
	code := Rules[filewritev1.ErrorReason(filewritev1.ErrorReason_value[info.GetReason()])].HTTP
	return code, code != 0
}

// RetryDelay returns the delay of err's RetryInfo, if its status has one.
func RetryDelay(err error) (time.Duration, bool) {
	var he *runtime.HTTPStatusError
	if errors.As(err, &he) {
		err = he.Err
	}
	st, ok := grpcstatus.FromError(err)
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

// BudgetWaitError is the error of a request whose context ended while it
// waited for the in-flight budget: errors.Is matches the context's error.
type BudgetWaitError struct {
	Capacity int64
	Err      error
}

func (e *BudgetWaitError) Error() string {
	return fmt.Sprintf("waited for memory (%d bytes in flight at most): %v", e.Capacity, e.Err)
}

func (e *BudgetWaitError) Unwrap() error { return e.Err }

// The WriteStream's own refusals, kept here so that the stream's framing
// (service/internal/rpc) only names them.

func WriteIDInUse(id uint64) error {
	return Refusal(filewritev1.ErrorReason_WRITE_ID_IN_USE, map[string]string{errorinfo.KeyField: "writes.id", "id": strconv.FormatUint(id, 10)},
		"write id %d is already in use by a write not yet acknowledged", id)
}

func TooManyFilesOnStream(limit int) error {
	return Refusal(filewritev1.ErrorReason_TOO_MANY_FILES_ON_STREAM, map[string]string{errorinfo.KeyLimit: strconv.Itoa(limit), errorinfo.KeyField: "files"},
		"the stream holds %d declared files already: the limit is %d files per stream (--max-files-per-stream); close one on the stream, or open another stream", limit, limit)
}

func UnknownStreamFile(index uint32) error {
	return Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "writes.file", "index": strconv.FormatUint(uint64(index), 10)},
		"a write names file %d, which is not on the stream: declare it first (files), or name the stream's path in its first message for index 0", index)
}

func MessageTooLarge(size int, limit int64) error {
	return Refusal(filewritev1.ErrorReason_REQUEST_TOO_LARGE, map[string]string{errorinfo.KeyLimit: strconv.FormatInt(limit, 10), errorinfo.KeyField: "writes"},
		"a message of %d bytes: the limit is %d (--max-request-bytes plus %d)", size, limit, MessageOverhead)
}

func StreamIdle(timeout time.Duration) error {
	return Refusal(filewritev1.ErrorReason_STREAM_IDLE, nil,
		"the stream was idle for %v (--stream-idle-timeout): every write it read was acknowledged; open a new stream to write again", timeout)
}

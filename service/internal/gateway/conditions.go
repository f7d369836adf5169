package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
)

// The gateway's preconditions and ranges (RFC 9110, sections 13 and 14),
// decided on one Stat of the file: what the headers announce and what the
// conditions compare is that one state. A mutation under conditions is
// then made conditional on the generation that Stat saw (conditional), so
// that nothing lands between the decision and the change.

// DefaultLastModifiedDelay is how long after its last change a file goes
// without a Last-Modified. Two changes within one second leave the same
// HTTP-date, and within one tick of the kernel's coarse clock (a few
// milliseconds; kernels before 6.13 use it for every ctime) the same
// ctime: a date handed out in that second could stay the same across the
// next change, and If-Unmodified-Since would let a stale writer through.
// Git's index calls such entries "racily clean". The ETag, made of the
// file's generation, has no such window.
const DefaultLastModifiedDelay = time.Second

// validators is what a Stat says about a file's version.
type validators struct {
	etag string // the strong tag (status.ETag); empty if no file exists
	gen  int64  // the generation; 0 if no file exists
	// lastModified is the ctime to the second; zero while the file
	// changed within the last LastModifiedDelay.
	lastModified time.Time
	exists       bool
}

// validatorsOf is what st, a Stat made at now, says; nil st: no file.
func (g *gateway) validatorsOf(st *filewritev1.StatResponse, now time.Time) validators {
	if st == nil {
		return validators{}
	}
	v := validators{etag: st.GetEtag(), gen: st.GetGeneration(), exists: true}
	if ct := st.GetChangeTime(); ct != nil && now.Sub(ct.AsTime()) >= g.LastModifiedDelay {
		v.lastModified = ct.AsTime().Truncate(time.Second)
	}
	return v
}

// setHeaders announces v.
func (v validators) setHeaders(h http.Header) {
	if v.etag != "" {
		h.Set("ETag", v.etag)
	}
	if !v.lastModified.IsZero() {
		h.Set("Last-Modified", v.lastModified.UTC().Format(http.TimeFormat))
	}
}

// failedCondition is the precondition that decided a 412.
type failedCondition struct {
	header string
	any    bool // its value was "*": a condition on existence
}

// preconditionStatus evaluates r's preconditions against v in the order of
// RFC 9110, section 13.2.2, and returns the status to answer instead of
// serving the request (412, or 304 for GET and HEAD) and the condition
// that decided it, or 0 to serve it. A malformed entity-tag list is a
// REQUEST_MALFORMED refusal (400); a malformed date is ignored, as RFC
// 9110 asks.
func preconditionStatus(r *http.Request, v validators) (code int, failed failedCondition, err error) {
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	if vals := r.Header.Values("If-Match"); len(vals) > 0 {
		l, err := status.ParseETagList(vals)
		if err != nil {
			return 0, failed, malformedHeader("If-Match", err)
		}
		if !l.MatchesStrong(v.etag, v.exists) {
			return http.StatusPreconditionFailed, failedCondition{"If-Match", l.Any}, nil
		}
	} else if t, ok := headerDate(r, "If-Unmodified-Since"); ok {
		if v.lastModified.IsZero() || v.lastModified.After(t) {
			return http.StatusPreconditionFailed, failedCondition{header: "If-Unmodified-Since"}, nil
		}
	}
	if vals := r.Header.Values("If-None-Match"); len(vals) > 0 {
		l, err := status.ParseETagList(vals)
		if err != nil {
			return 0, failed, malformedHeader("If-None-Match", err)
		}
		if l.MatchesWeak(v.etag, v.exists) {
			if read {
				return http.StatusNotModified, failedCondition{"If-None-Match", l.Any}, nil
			}
			return http.StatusPreconditionFailed, failedCondition{"If-None-Match", l.Any}, nil
		}
	} else if t, ok := headerDate(r, "If-Modified-Since"); ok && read {
		if !v.lastModified.IsZero() && !v.lastModified.After(t) {
			return http.StatusNotModified, failedCondition{header: "If-Modified-Since"}, nil
		}
	}
	return 0, failed, nil
}

// preconditionFailed is the error of a 412: c is the precondition that
// failed on the file v describes. A condition on a tag is ETAG_MISMATCH,
// one on existence or a date PRECONDITION_FAILED; both carry the file's
// generation and tag, as the store's refusal of a generation does.
func preconditionFailed(c failedCondition, v validators) error {
	note := ""
	if v.exists && c.header == "If-Unmodified-Since" && v.lastModified.IsZero() {
		note = " (no Last-Modified: it changed within the last second)"
	}
	onTag := !c.any && (c.header == "If-Match" || c.header == "If-None-Match")
	return &runtime.HTTPStatusError{
		HTTPStatus: http.StatusPreconditionFailed,
		Err:        status.PreconditionFailed(c.header, onTag, v.gen, v.etag, note),
	}
}

// malformedHeader is the refusal of a request header that does not parse.
func malformedHeader(name string, err error) error {
	return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: name}, "%s: %v", name, err)
}

// headerDate is the HTTP-date in r's header name, if it holds one.
func headerDate(r *http.Request, name string) (time.Time, bool) {
	s := r.Header.Get(name)
	if s == "" {
		return time.Time{}, false
	}
	t, err := http.ParseTime(s)
	return t, err == nil
}

// hasConditions reports whether h puts a precondition on a mutation (RFC
// 9110, section 13.1): If-Match, If-None-Match or If-Unmodified-Since.
func hasConditions(h http.Header) bool {
	return len(h.Values("If-Match")) > 0 || len(h.Values("If-None-Match")) > 0 || h.Get("If-Unmodified-Since") != ""
}

// conditionAttempts bounds how often a mutation under HTTP preconditions
// is decided again when the file changed between the Stat its
// preconditions were decided on and the mutation (conditional).
const conditionAttempts = 3

// statFunc is a Stat of the file a mutation names: nil, nil when none
// exists.
type statFunc func(ctx context.Context) (*filewritev1.StatResponse, error)

// decide evaluates r's preconditions on a Stat of its file, and returns
// the generation they held for, to make the mutation conditional on (0:
// no file exists), or the refusal to answer (412; 400 for a malformed
// tag list).
func (g *gateway) decide(ctx context.Context, r *http.Request, stat statFunc) (int64, error) {
	st, err := stat(ctx)
	if err != nil {
		return 0, err
	}
	v := g.validatorsOf(st, time.Now())
	code, failed, err := preconditionStatus(r, v)
	switch {
	case err != nil:
		return 0, err
	case code != 0:
		return 0, preconditionFailed(failed, v)
	}
	return v.gen, nil
}

// conditional makes mutate, a mutation of the file r names, under r's
// preconditions (If-Match, If-None-Match, If-Unmodified-Since): they are
// decided on a Stat, and mutate is told the generation they held for, to
// make itself conditional on (if_generation_match: that one, or 0 for no
// file), so that the file it changes is the one they were decided on.
func (g *gateway) conditional(ctx context.Context, r *http.Request, stat statFunc, mutate func(gen int64) error) error {
	gen, err := g.decide(ctx, r, stat)
	if err != nil {
		return err
	}
	return g.redecided(ctx, r, stat, gen, mutate)
}

// redecided is conditional once the preconditions were decided for gen:
// a mutation refused because the file changed since is decided again, on
// a new Stat, up to conditionAttempts times; then its refusal (412,
// ETAG_MISMATCH) is the answer.
func (g *gateway) redecided(ctx context.Context, r *http.Request, stat statFunc, gen int64, mutate func(gen int64) error) error {
	for attempt := 1; ; attempt++ {
		err := mutate(gen)
		if _, changed := status.CurrentGeneration(err); !changed || attempt == conditionAttempts {
			return err
		}
		if gen, err = g.decide(ctx, r, stat); err != nil {
			return err
		}
	}
}

// statOf is the statFunc of path through files.
func statOf(files Files, path string) statFunc {
	return func(ctx context.Context) (*filewritev1.StatResponse, error) {
		return noneIfMissing(files.Stat(ctx, &filewritev1.StatRequest{Path: path}))
	}
}

// noneIfMissing is a Stat's answer as a statFunc gives it: nil, nil for
// NOT_FOUND.
func noneIfMissing(st *filewritev1.StatResponse, err error) (*filewritev1.StatResponse, error) {
	if grpcstatus.Code(err) == codes.NotFound {
		return nil, nil
	}
	return st, err
}

// byteRange is the inclusive range [first, last] of a file.
type byteRange struct{ first, last int64 }

func (b byteRange) length() int64 { return b.last - b.first + 1 }

// errUnsatisfiable is returned when a Range names no byte of the file, or
// cannot be parsed as a byte range (RFC 9110, section 14.1.1: a server
// answers both with 416).
var errUnsatisfiable = errors.New("range not satisfiable")

// parseRange reads a Range header against a file of size bytes. ok is false
// when the whole file is to be served: no Range, another unit than bytes,
// or more than one range (served whole rather than as multipart/byteranges,
// which no client of a file service needs).
func parseRange(header string, size int64) (r byteRange, ok bool, err error) {
	if header == "" {
		return byteRange{}, false, nil
	}
	unit, spec, found := strings.Cut(header, "=")
	if !found {
		return byteRange{}, false, errUnsatisfiable
	}
	if !strings.EqualFold(strings.TrimSpace(unit), "bytes") {
		return byteRange{}, false, nil
	}
	if strings.Contains(spec, ",") {
		return byteRange{}, false, nil
	}
	spec = strings.TrimSpace(spec)
	firstS, lastS, found := strings.Cut(spec, "-")
	if !found {
		return byteRange{}, false, errUnsatisfiable
	}
	if firstS == "" { // bytes=-n: the last n bytes
		n, err := parseDigits(lastS)
		if err != nil || n == 0 || size == 0 {
			return byteRange{}, false, errUnsatisfiable
		}
		return byteRange{first: max(size-n, 0), last: size - 1}, true, nil
	}
	first, err := parseDigits(firstS)
	if err != nil || first >= size {
		return byteRange{}, false, errUnsatisfiable
	}
	last := size - 1
	if lastS != "" {
		l, err := parseDigits(lastS)
		if err != nil || l < first {
			return byteRange{}, false, errUnsatisfiable
		}
		last = min(l, size-1)
	}
	return byteRange{first: first, last: last}, true, nil
}

// parseDigits parses 1*DIGIT; a value past int64 counts as its largest.
func parseDigits(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errUnsatisfiable
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return 1<<63 - 1, nil
	}
	return n, err
}

// ifRangeHolds reports whether r's If-Range (if any) lets its Range apply
// (RFC 9110, section 13.1.5): a strong tag equal to the file's, or a date
// equal to its Last-Modified. A weak tag never holds.
func ifRangeHolds(r *http.Request, v validators) bool {
	s := strings.TrimSpace(r.Header.Get("If-Range"))
	switch {
	case s == "":
		return true
	case strings.HasPrefix(s, "W/"):
		return false
	case strings.HasPrefix(s, `"`):
		return v.etag != "" && s == v.etag
	}
	t, err := http.ParseTime(s)
	return err == nil && !v.lastModified.IsZero() && v.lastModified.Equal(t)
}

// conditionsKey marks the context of a REST request to a JSON route whose
// headers put preconditions on its mutation: the value is a
// *conditionedRequest (serveHTTP).
type conditionsKey struct{}

// conditionedRequest is what Preconditions needs of such a request.
type conditionedRequest struct {
	g *gateway
	r *http.Request
}

// Preconditions is a unary interceptor of the gateway's connection to its
// gRPC server: the mutation a JSON route calls (Write, Append, Truncate,
// Fallocate, Delete, Rename; not Fsync, which changes no content) for a
// request with preconditions (If-Match, If-None-Match,
// If-Unmodified-Since) is made conditional on the generation of the file
// they were decided on (conditional), through its if_generation_match.
// They are on the file the URL names (a Rename's source); a request that
// also puts conditions of its own on that file in its body is refused:
// one of the two would be dropped.
func Preconditions(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c, ok := ctx.Value(conditionsKey{}).(*conditionedRequest)
	match, notMatch, mutation := generationFields(req)
	if !ok || !mutation {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if *match != nil || *notMatch != nil {
		return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "ifGenerationMatch"},
			"the request puts conditions on the file both in its headers (If-Match, If-None-Match, If-Unmodified-Since) and in its body (ifGenerationMatch, ifGenerationNotMatch): give them once")
	}
	path := req.(interface{ GetPath() string }).GetPath()
	stat := func(ctx context.Context) (*filewritev1.StatResponse, error) {
		st := new(filewritev1.StatResponse)
		return noneIfMissing(st, cc.Invoke(ctx, filewritev1.FileService_Stat_FullMethodName, &filewritev1.StatRequest{Path: path}, st, opts...))
	}
	return c.g.conditional(ctx, c.r, stat, func(gen int64) error {
		*match = &gen
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

// generationFields are the conditions on the file req names
// (if_generation_match, if_generation_not_match) of a mutation that REST
// preconditions apply to; ok is false for any other request.
func generationFields(req any) (match, notMatch **int64, ok bool) {
	switch r := req.(type) {
	case *filewritev1.WriteRequest:
		return &r.IfGenerationMatch, &r.IfGenerationNotMatch, true
	case *filewritev1.AppendRequest:
		return &r.IfGenerationMatch, &r.IfGenerationNotMatch, true
	case *filewritev1.TruncateRequest:
		return &r.IfGenerationMatch, &r.IfGenerationNotMatch, true
	case *filewritev1.FallocateRequest:
		return &r.IfGenerationMatch, &r.IfGenerationNotMatch, true
	case *filewritev1.DeleteRequest:
		return &r.IfGenerationMatch, &r.IfGenerationNotMatch, true
	case *filewritev1.RenameRequest:
		return &r.IfGenerationMatch, &r.IfGenerationNotMatch, true
	}
	return nil, nil, false
}

// etagHeader sets the ETag of the file a reply describes: a mutation's
// (the generation it left), Stat's and Digest's.
func etagHeader(_ context.Context, w http.ResponseWriter, m proto.Message) error {
	if r, ok := m.(interface{ GetGeneration() int64 }); ok && r.GetGeneration() != 0 {
		w.Header().Set("ETag", status.ETag(r.GetGeneration()))
	}
	return nil
}

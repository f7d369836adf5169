package gateway

import (
	"context"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
)

// appendPattern is the REST route of Append: JSON like every POST, or the
// data itself as an application/octet-stream body (appendRaw).
const appendPattern = "/v1/files/{path=**}:append"

// HeaderAppendOffset carries where an append landed, beside the JSON body,
// so that a script can read it without parsing JSON.
const HeaderAppendOffset = "Filewrite-Offset"

// isRawAppend reports whether r is an append whose body is the data.
func isRawAppend(r *http.Request) bool {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, ":append") {
		return false
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == MIMEOctetStream
}

// appendOffsetHeader sets HeaderAppendOffset on the answer of an append,
// JSON or raw.
func appendOffsetHeader(_ context.Context, w http.ResponseWriter, m proto.Message) error {
	if a, ok := m.(*filewritev1.AppendResponse); ok {
		w.Header().Set(HeaderAppendOffset, strconv.FormatInt(a.GetOffset(), 10))
	}
	return nil
}

// appendRaw is POST /v1/files/{path}:append?sync=none|data|full
// &expected_offset=N&append_id=ID with an application/octet-stream body:
// one Append of the whole body. A reserved range is one contiguous write,
// so the body is not chunked as a PUT's is: its Content-Length is required
// and at most --max-request-bytes, and the body is read whole first. Its
// preconditions are decided before the body is read, and the Append made
// conditional on the generation they held for, as a PUT's first piece;
// its checksums (checksum.go) are compared before it is made.
func (g *gateway) appendRaw(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	ctx := r.Context()
	_, out := runtime.MarshalerForRequest(g.mux, r)
	fail := func(err error) { runtime.HTTPError(ctx, g.mux, out, w, r, err) }
	req, err := rawAppendQuery(r.URL.RawQuery)
	if err != nil {
		fail(err)
		return
	}
	req.Path = pathParams["path"]
	switch n := r.ContentLength; {
	case n < 0:
		fail(&runtime.HTTPStatusError{HTTPStatus: http.StatusLengthRequired,
			Err: status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "a raw append needs a Content-Length: its bytes are one contiguous range, reserved before they are read")})
		return
	case n > g.MaxRequestBytes:
		fail(g.dataTooLarge(n))
		return
	}
	digests, err := uploadDigestsOf(w, r)
	if err != nil {
		fail(err)
		return
	}
	ctx, err = g.callContext(r, filewritev1.FileService_Append_FullMethodName, appendPattern)
	if err != nil {
		fail(err)
		return
	}
	conditional, stat := hasConditions(r.Header), statOf(g.files, req.Path)
	var gen int64
	if conditional {
		if gen, err = g.decide(ctx, r, stat); err != nil {
			fail(err)
			return
		}
	}
	req.Data = make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, req.Data); err != nil {
		b, _ := r.Body.(*requestBody)
		if b == nil {
			b = &requestBody{}
		}
		fail(g.bodyError(b, err))
		return
	}
	digests.write(req.Data)
	if err := digests.verify(0, 0); err != nil {
		fail(err)
		return
	}
	var resp *filewritev1.AppendResponse
	if conditional {
		err = g.redecided(ctx, r, stat, gen, func(gen int64) error {
			req.IfGenerationMatch = &gen
			resp, err = g.files.Append(ctx, req)
			return err
		})
	} else {
		resp, err = g.files.Append(ctx, req)
	}
	if err != nil {
		fail(err)
		return
	}
	runtime.ForwardResponseMessage(r.Context(), g.mux, out, w, r, resp, g.mux.GetForwardResponseOptions()...)
}

// rawAppendQuery parses the query of a raw append: sync, expected_offset
// and append_id (rawQueryValues).
func rawAppendQuery(rawQuery string) (*filewritev1.AppendRequest, error) {
	q, err := rawQueryValues(rawQuery, "a raw append takes sync, expected_offset and append_id", "sync", "expected_offset", "append_id")
	if err != nil {
		return nil, err
	}
	req := &filewritev1.AppendRequest{AppendId: q["append_id"]}
	if s, ok := q["expected_offset"]; ok {
		off, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "expected_offset"}, "expected_offset %q is not an int64", s)
		}
		req.ExpectedOffset = &off
	}
	if s, ok := q["sync"]; ok {
		if req.Sync, err = parseRawSync(s); err != nil {
			return nil, err
		}
	}
	return req, nil
}

package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/media"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// The download route: GET /v1/files/{path}?alt=media answers the file's
// bytes, as GCS's JSON API does, with RFC 9110 ranges and validators. HEAD
// answers the same headers without reading the file.
const mediaPattern = "/v1/files/{path=**}"

// newMediaMux routes the requests that carry "alt": the bare file path
// downloads; the verb routes that share its prefix take no alt and say so.
// It is a mux of its own so that its path matching, verbs and escapes are
// grpc-gateway's, as on every other route.
func (g *gateway) newMediaMux() (*runtime.ServeMux, error) {
	errAlt := status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "alt"},
		"alt is a parameter of GET /v1/files/{path} only: alt=media downloads the file")
	refuse := func(w http.ResponseWriter, r *http.Request, _ map[string]string) { g.fail(w, r, errAlt) }
	mux := runtime.NewServeMux(
		runtime.WithErrorHandler(g.handleError),
		runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, _ int) {
			g.fail(w, r, errAlt)
		}),
		runtime.WithOutgoingHeaderMatcher(dropMetadata),
		runtime.WithOutgoingTrailerMatcher(dropMetadata),
	)
	for _, route := range []struct {
		pattern string
		h       runtime.HandlerFunc
	}{
		{mediaPattern, g.getMedia},
		// Registered after the bare path, so that they are tried first.
		{readPattern, refuse},
		{"/v1/files/{path=**}:extents", refuse},
		{"/v1/files/{path=**}:digest", refuse},
	} {
		if err := mux.HandlePath(http.MethodGet, route.pattern, route.h); err != nil {
			return nil, fmt.Errorf("register %s: %w", route.pattern, err)
		}
	}
	return mux, nil
}

// hasAlt reports whether r's query names alt, which only the download route
// takes.
func hasAlt(r *http.Request) bool {
	q, err := url.ParseQuery(r.URL.RawQuery)
	return err == nil && q.Has("alt")
}

// headKey marks the context of a HEAD request that the gateway serves as a
// GET (grpc-gateway routes no HEAD): net/http drops what is written to its
// body, and the download route reads nothing.
type headKey struct{}

func isHead(ctx context.Context) bool { return ctx.Value(headKey{}) != nil }

// fail answers err as grpc-gateway answers an error of the request.
func (g *gateway) fail(w http.ResponseWriter, r *http.Request, err error) {
	_, out := runtime.MarshalerForRequest(g.mux, r)
	runtime.HTTPError(r.Context(), g.mux, out, w, r, err)
}

// getMedia is GET (and HEAD) /v1/files/{path}?alt=media.
//
// The headers come from one Stat: the size they announce, the range they
// cut, the validators they carry and the preconditions they decide on.
// The body is then read in Reads of ReadChunkBytes, each one a moment of
// its own, so a download that runs while the file is written is not one
// state of it; its ETag names the state the Stat saw. A file that grows
// meanwhile is served to the announced length; one that shrinks, is
// deleted or fails to read is cut short (the connection reset), so that
// the client, missing the announced length, sees that it failed.
func (g *gateway) getMedia(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	ctx := r.Context()
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		g.fail(w, r, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "query %q: %v", r.URL.RawQuery, err))
		return
	}
	attachment := false
	for key, vals := range q {
		switch {
		case key == "download" && len(vals) == 1 && (vals[0] == "1" || vals[0] == "true"):
			attachment = true
		case key == "download":
			g.fail(w, r, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: key},
				"download=%q: want download=1, which serves the file as an attachment whatever its type", vals))
			return
		case key != "alt":
			g.fail(w, r, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: key},
				"unknown query parameter %q: a download takes alt=media, download=1 and a Range header", key))
			return
		case len(vals) != 1 || vals[0] != "media":
			g.fail(w, r, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "alt"},
				"alt=%q: want alt=media (without alt, GET answers the file's description as JSON)", vals))
			return
		}
	}
	path := pathParams["path"]
	callCtx, err := g.callContext(r, filewritev1.FileService_Stat_FullMethodName, mediaPattern)
	if err != nil {
		g.fail(w, r, err)
		return
	}
	st, err := g.files.Stat(callCtx, &filewritev1.StatRequest{Path: path})
	if err != nil {
		g.fail(w, r, err)
		return
	}
	v := g.validatorsOf(st, time.Now())
	h := w.Header()
	v.setHeaders(h)
	if d := g.reprDigest(st); d != "" {
		h.Set("Repr-Digest", d)
	}
	h.Set("Accept-Ranges", "bytes")
	// Revalidate every time: the file changes under its URL, and a cache
	// would otherwise reuse it for as long as its Last-Modified suggests.
	h.Set("Cache-Control", "no-cache")
	if code, failed, err := preconditionStatus(r, v); err != nil {
		g.fail(w, r, err)
		return
	} else if code == http.StatusPreconditionFailed {
		g.fail(w, r, preconditionFailed(failed, v))
		return
	} else if code != 0 {
		w.WriteHeader(code)
		return
	}

	size := st.GetSize()
	span := byteRange{first: 0, last: size - 1}
	code := http.StatusOK
	if ifRangeHolds(r, v) {
		rng, ok, err := parseRange(r.Header.Get("Range"), size)
		if err != nil {
			h.Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			g.fail(w, r, &runtime.HTTPStatusError{
				HTTPStatus: http.StatusRequestedRangeNotSatisfiable,
				Err: status.Refusal(filewritev1.ErrorReason_RANGE_NOT_SATISFIABLE, map[string]string{"size": strconv.FormatInt(size, 10)},
					"Range %q: the file has %d bytes; send bytes=first-last, bytes=first- or bytes=-suffix", r.Header.Get("Range"), size),
			})
			return
		}
		if ok {
			span, code = rng, http.StatusPartialContent
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", rng.first, rng.last, size))
		}
	}
	// The type the file was given, shown in place only if it runs
	// nothing, and never sniffed: a browser must not take the bytes for a
	// page of the daemon's origin.
	media.SetHeaders(h, path, st.GetContentType(), attachment)
	h.Set("Content-Length", strconv.FormatInt(span.length(), 10))
	var rd *local.Reader
	if g.Local != nil && !isHead(ctx) && span.length() > 0 {
		// The file's own descriptor, for sendfile(2): checked and
		// traced as a Read of it.
		if rd, err = g.Local.OpenReader(callCtx, path); err != nil {
			g.fail(w, r, err)
			return
		}
		defer rd.Close()
	}
	w.WriteHeader(code)
	if isHead(ctx) || span.length() <= 0 {
		return
	}
	if rd != nil && rd.File != nil {
		sendFile(w, rd, span)
		return
	}

	readCtx, err := g.callContext(r, filewritev1.FileService_Read_FullMethodName, mediaPattern)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	for off := span.first; off <= span.last; {
		n := min(span.last+1-off, ReadChunkBytes)
		resp, err := g.files.Read(readCtx, &filewritev1.ReadRequest{Path: path, Offset: off, Length: n})
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		data := resp.GetData()
		if int64(len(data)) < n || (resp.Crc32C != nil && resp.GetCrc32C() != crc32.Checksum(data, status.Castagnoli)) {
			// Shrunk, deleted and recreated, or damaged on the way: the
			// announced length cannot be met.
			panic(http.ErrAbortHandler)
		}
		if _, err := w.Write(data); err != nil {
			return // the client went away
		}
		off += n
	}
}

// reprDigest is the Repr-Digest (RFC 9530) of the file st describes, the
// checksums of the whole file at its generation that a Digest computed
// and the store still keeps; "" when it keeps none. Nothing is read.
func (g *gateway) reprDigest(st *filewritev1.StatResponse) string {
	if g.Local == nil {
		return ""
	}
	var members []string
	for _, alg := range []store.DigestAlgorithm{store.DigestCRC32C, store.DigestSHA256} {
		if sum, ok := g.Local.CachedDigest(st.GetGeneration(), 0, st.GetSize(), alg); ok {
			members = append(members, alg.String()+"=:"+base64.StdEncoding.EncodeToString(sum)+":")
		}
	}
	return strings.Join(members, ", ")
}

// downloadPieceBytes is how much of a download sendFile hands the kernel
// at a time, checking between pieces that the file is still there.
const downloadPieceBytes = 8 << 20

// sendFile sends span of rd's file to w in pieces: net/http hands each,
// an *os.File behind an io.LimitedReader, to the connection's ReadFrom,
// which on TCP is sendfile(2), no byte copied through the daemon. Like the
// Reads it stands for, it serves no one moment of the file. A file deleted
// (or replaced by a Rename) meanwhile, or cut shorter than the announced
// length, ends the response short (the connection reset).
func sendFile(w http.ResponseWriter, rd *local.Reader, span byteRange) {
	if _, err := rd.File.Seek(span.first, io.SeekStart); err != nil {
		panic(http.ErrAbortHandler)
	}
	for off := span.first; off <= span.last; {
		select {
		case <-rd.Gone():
			panic(http.ErrAbortHandler)
		default:
		}
		n := min(span.last+1-off, downloadPieceBytes)
		if m, _ := io.CopyN(w, rd.File, n); m < n {
			panic(http.ErrAbortHandler) // shrunk, or the client went away
		}
		off += n
	}
}

package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// The gateway's streaming routes: the raw PUT writes its body in pieces
// as it arrives, and :read reads in chunks, so that a request holds a
// piece or a chunk at a time however much it moves.
const (
	// putPieceBytes bounds what one Write of a raw PUT carries: a piece
	// is at most this and --max-request-bytes (docs/http.md). Large
	// enough that a piece's call costs little next to its bytes, small
	// enough that a PUT holds little of --max-inflight-bytes.
	putPieceBytes = 8 << 20
	// ReadChunkBytes is the length of each Read a REST :read makes: a
	// multiple of 3, so that the base64 of the chunks, joined, is the
	// base64 of the whole.
	ReadChunkBytes = 3 << 18
)

// PutPieceBytes is the most one Write of a raw PUT carries under a
// --max-request-bytes of maxRequestBytes.
func PutPieceBytes(maxRequestBytes int64) int64 { return min(maxRequestBytes, putPieceBytes) }

// putPieces recycles the piece buffers of raw PUTs.
var putPieces = sync.Pool{New: func() any { b := make([]byte, putPieceBytes); return &b }}

// putRaw is PUT /v1/files/{path}?offset=N&sync=none|data|full: a Write of
// the application/octet-stream body, for clients (curl) that should not
// have to base64 their data, of any size up to --max-file-size. A
// Content-Range header (RFC 9110, section 14.4) places the body instead
// of offset (contentrange.go). It answers like POST :write, with 201
// Created and a Location when the PUT created the file, and the file's
// ETag.
//
// The body goes into the file as it arrives, in Writes of at most
// pieceBytes at successive offsets, each read straight into the buffer it
// is written from; with a sync asked for, each piece's writeback starts
// as soon as it is written. Only the last carries the sync asked for, which makes
// durable every piece before it too (a synced write makes durable what
// was written to the file before it). A body that breaks midway (the
// client goes, --body-timeout passes, a Write fails) leaves the pieces
// already written, as a Write that fails while writing may leave part of
// its data. Limits that the body's declared length is known to pass are
// refused before anything is written, and so are failed preconditions
// (before the body is read, without a 100 Continue). Checksums the
// headers announce (checksum.go) are compared before the last piece is
// written: a body of one piece that fails them writes nothing.
//
// Under preconditions every piece is a conditional Write: the first on
// the generation they were decided on (conditional), each later one on the
// generation the one before left, so that a writer that lands in between
// stops the PUT (412, naming what was written).
func (g *gateway) putRaw(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	_, out := runtime.MarshalerForRequest(g.mux, r)
	fail := func(err error) { runtime.HTTPError(r.Context(), g.mux, out, w, r, err) }

	// Any type: it is the file's from now on, served with its downloads
	// (the first Write sets it, and refuses one that is no media type
	// before it writes). A browser sends no PUT cross-site without asking
	// first.
	contentType := r.Header.Get("Content-Type")
	path := pathParams["path"]
	q, err := rawWriteQuery(r.URL.RawQuery)
	if err != nil {
		fail(err)
		return
	}
	offset := q.offset
	if cr, ok, err := parseContentRange(r.Header.Values("Content-Range")); err != nil {
		fail(err)
		return
	} else if ok {
		if err := cr.fits(q, r.ContentLength); err != nil {
			fail(err)
			return
		}
		offset = cr.first
	}
	if n := r.ContentLength; n > 0 && offset >= 0 && offset <= math.MaxInt64-n && offset+n > g.MaxFileSize {
		fail(status.Of(&store.Refusal{Err: store.ErrFileTooLarge, Arg: "offset", Limit: g.MaxFileSize,
			Detail: fmt.Sprintf("a PUT of %d bytes at offset %d ends at %d, the maximum file size is %d bytes", n, offset, offset+n, g.MaxFileSize)}))
		return
	}
	digests, err := uploadDigestsOf(w, r)
	if err != nil {
		fail(err)
		return
	}
	ctx, err := g.callContext(r, filewritev1.FileService_Write_FullMethodName, "/v1/files/{path=**}")
	if err != nil {
		fail(err)
		return
	}
	put := &rawPut{g: g, r: r, path: path, offset: offset, sync: q.sync, digests: digests, contentType: contentType, conditional: hasConditions(r.Header)}
	if put.conditional {
		// Decided before the body is read: a refused PUT reads none of
		// it (and the client that waits for 100 Continue sends none).
		if put.gen, err = g.decide(ctx, r, statOf(g.files, path)); err != nil {
			fail(err)
			return
		}
	}
	resp, err := put.run(ctx)
	if err != nil {
		fail(err)
		return
	}
	code := http.StatusOK
	if resp.GetCreated() {
		// RFC 9110, section 9.3.4: a PUT that creates its resource says
		// so, and where it is.
		code = http.StatusCreated
		w.Header().Set("Location", "/v1/files/"+path)
	}
	w.Header().Set("ETag", status.ETag(resp.GetGeneration()))
	forwardWithStatus(w, out, resp, code)
}

// rawPut is one raw PUT's body on its way into the file.
type rawPut struct {
	g       *gateway
	r       *http.Request
	path    string
	offset  int64
	sync    filewritev1.SyncMode
	digests uploadDigests
	// contentType is the body's Content-Type, the file's type from now on.
	contentType string
	// conditional: the request has preconditions, decided on the file of
	// generation gen (0: none), which each piece's Write is made
	// conditional on in turn.
	conditional bool
	gen         int64
}

// run writes the body and returns the reply: the WriteResponse of the
// whole body, its first Write's created and its last Write's size and
// generation.
func (p *rawPut) run(ctx context.Context) (*filewritev1.WriteResponse, error) {
	g, r := p.g, p.r
	buf := putPieces.Get().(*[]byte)
	defer putPieces.Put(buf)
	piece := (*buf)[:g.pieceBytes]
	body := &lookahead{r: r.Body, left: r.ContentLength}
	var written int64
	reply := &filewritev1.WriteResponse{}
	for last := false; !last; {
		n, err := body.fill(piece)
		if err != nil {
			b, _ := r.Body.(*requestBody)
			if b == nil {
				b = &requestBody{}
			}
			return nil, g.bodyError(b, err)
		}
		last = body.done
		p.digests.write(piece[:n])
		if last {
			if err := p.digests.verify(p.offset, written); err != nil {
				return nil, err
			}
		}
		req := &filewritev1.WriteRequest{Path: p.path, Offset: p.offset + written, Data: piece[:n]}
		if last {
			req.Sync = p.sync
		}
		if written == 0 {
			// The first Write gives the file its type.
			req.ContentType = p.contentType
		}
		var resp *filewritev1.WriteResponse
		switch {
		case !p.conditional:
			resp, err = g.files.Write(ctx, req)
		case written == 0:
			// The first piece is in memory: if the file changed since
			// the preconditions were decided, they are decided again.
			err = g.redecided(ctx, r, statOf(g.files, p.path), p.gen, func(gen int64) error {
				req.IfGenerationMatch = &gen
				resp, err = g.files.Write(ctx, req)
				return err
			})
		default:
			req.IfGenerationMatch = &reply.Generation
			resp, err = g.files.Write(ctx, req)
			if _, changed := status.CurrentGeneration(err); changed {
				err = interleaved(err, p.path, p.offset, written)
			}
		}
		if err != nil {
			return nil, err
		}
		if written == 0 {
			reply.Created = resp.GetCreated()
		}
		if !last && p.sync != filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED && g.Local != nil && resp.GetBytesWritten() < store.WriteBackAfter {
			// The disk takes this piece while the next arrives, so
			// that the sync at the end has little left to write (a
			// piece of store.WriteBackAfter or more started its own).
			// A failure to start shows in that sync.
			g.Local.StartWriteBack(ctx, p.path, req.GetOffset(), resp.GetBytesWritten())
		}
		written += resp.GetBytesWritten()
		reply.Size, reply.Generation = resp.GetSize(), resp.GetGeneration()
	}
	reply.BytesWritten = written
	return reply, nil
}

// interleaved is the 412 of a conditional PUT that a writer came between
// two of its pieces: err, the refusal of the piece, naming what the PUT
// wrote before it.
func interleaved(err error, path string, offset, written int64) error {
	gen, _ := status.CurrentGeneration(err)
	md := map[string]string{
		errorinfo.KeyGeneration: strconv.FormatInt(gen, 10),
		"etag":                  status.ETag(gen),
		"offset":                strconv.FormatInt(offset, 10),
		"bytes_written":         strconv.FormatInt(written, 10),
	}
	return status.Refusal(filewritev1.ErrorReason_ETAG_MISMATCH, md,
		"precondition failed: %s was changed by another writer while this PUT wrote it: its first %d bytes are written at offset %d (bytes %d-%d), the rest is not; the file's ETag is %s",
		path, written, offset, offset, offset+written-1, status.ETag(gen))
}

// forwardWithStatus answers msg, encoded by out, with code: grpc-gateway's
// ForwardResponseMessage answers 200 only.
func forwardWithStatus(w http.ResponseWriter, out runtime.Marshaler, msg proto.Message, code int) {
	b, err := out.Marshal(msg)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	h := w.Header()
	h.Set("Content-Type", out.ContentType(msg))
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	w.Write(b)
}

// lookahead reads a body in chunks and tells, with the chunk that holds
// its last byte, that it is the last: the raw PUT's last Write is the one
// that syncs. With the body's length declared, the count says so; without,
// a full chunk is the last only if not one more byte follows, so it is
// written only once that byte (or the end) has arrived.
type lookahead struct {
	r     io.Reader
	left  int64   // bytes still to come, -1 if the length is not declared
	next  [1]byte // a byte read past the previous chunk
	ahead bool    // whether next holds one
	done  bool    // the chunk just filled is the last
}

// fill reads into p until it is full or the body ends.
func (l *lookahead) fill(p []byte) (int, error) {
	if l.left >= 0 && int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n := 0
	if l.ahead {
		p[0] = l.next[0]
		n, l.ahead = 1, false
	}
	m, err := io.ReadFull(l.r, p[n:])
	n += m
	if l.left >= 0 {
		l.left -= int64(m)
		if err == nil && l.left == 0 {
			l.done = true
		}
		return n, err // a body shorter than declared is an error
	}
	switch err {
	case nil:
		// Full: the body ends here only if nothing follows.
		if _, err := io.ReadFull(l.r, l.next[:]); err == io.EOF {
			l.done = true
		} else if err != nil {
			return n, err
		} else {
			l.ahead = true
		}
	case io.EOF, io.ErrUnexpectedEOF:
		l.done = true
	default:
		return n, err
	}
	return n, nil
}

func (g *gateway) dataTooLarge(n int64) error {
	if n < 0 {
		return status.Refusal(filewritev1.ErrorReason_REQUEST_TOO_LARGE, g.requestLimit(), "body exceeds --max-request-bytes (%d bytes)", g.MaxRequestBytes)
	}
	return status.Refusal(filewritev1.ErrorReason_REQUEST_TOO_LARGE, g.requestLimit(), "body of %d bytes exceeds --max-request-bytes (%d bytes)", n, g.MaxRequestBytes)
}

// readPattern is the REST route of Read.
const readPattern = "/v1/files/{path=**}:read"

// readQuery is the fields of ReadRequest that the route's path binds, as
// runtime.PopulateQueryParameters wants them.
var readQuery = utilities.NewDoubleArray([][]string{{"path"}})

// readStreamed is GET /v1/files/{path}:read?offset=N&length=N, which
// grpc-gateway would answer with one Read whose data it holds several
// times over (the reply, its decoding, its JSON). It reads in Reads of
// ReadChunkBytes instead and writes each out before the next: as raw bytes
// when asked with "Accept: application/octet-stream", else as the JSON of
// one ReadResponse. Each Read sees the file as of its own moment, so a
// read longer than a chunk is not one snapshot (nor is one gRPC Read under
// writes below EOF that take no lock).
//
// An error before the first byte is answered as usual. After it, the
// status is sent already: the response is cut short (the connection
// reset), so that a client cannot take what it got for the whole.
func (g *gateway) readStreamed(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	ctx := r.Context()
	_, out := runtime.MarshalerForRequest(g.mux, r)
	fail := func(err error) { runtime.HTTPError(ctx, g.mux, out, w, r, err) }

	req := &filewritev1.ReadRequest{Path: pathParams["path"]}
	if err := r.ParseForm(); err != nil {
		fail(status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "%v", err))
		return
	}
	if err := runtime.PopulateQueryParameters(req, r.Form, readQuery); err != nil {
		fail(status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "%v", err))
		return
	}
	ctx, err := g.callContext(r, filewritev1.FileService_Read_FullMethodName, readPattern)
	if err != nil {
		fail(err)
		return
	}
	if !r.Form.Has("length") {
		// To the end of the file as one Stat sees it, and within the
		// limit of one Read: a client that wants more downloads it
		// (alt=media), in as many chunks as it takes.
		st, err := g.files.Stat(ctx, &filewritev1.StatRequest{Path: req.GetPath()})
		if err != nil {
			fail(err)
			return
		}
		req.Length = max(st.GetSize()-req.GetOffset(), 0)
		if req.Length > g.MaxRequestBytes {
			fail(status.Of(&store.Refusal{Err: store.ErrRequestTooLarge, Arg: "length", Limit: g.MaxRequestBytes,
				Detail: fmt.Sprintf("%d bytes from offset %d to the end of the file, the maximum per request is %d; "+
					"give a length, or download the file with GET /v1/files/{path}?alt=media", req.Length, req.GetOffset(), g.MaxRequestBytes)}))
			return
		}
	}
	_, raw := out.(rawMarshaler)
	enc := base64.StdEncoding
	var text []byte // the base64 of a chunk
	off, left := req.GetOffset(), req.GetLength()
	crc, withCRC := uint32(0), true
	for first := true; ; first = false {
		n := min(left, ReadChunkBytes)
		if first && left > g.MaxRequestBytes {
			// The server refuses this length as it refuses one Read.
			n = left
		}
		resp, err := g.files.Read(ctx, &filewritev1.ReadRequest{Path: req.GetPath(), Offset: off, Length: n})
		if err != nil {
			if first {
				fail(err)
				return
			}
			panic(http.ErrAbortHandler)
		}
		data := resp.GetData()
		if resp.Crc32C == nil {
			withCRC = false
		} else if resp.GetCrc32C() != crc32.Checksum(data, status.Castagnoli) {
			panic(http.ErrAbortHandler)
		}
		crc = crc32.Update(crc, status.Castagnoli, data)
		if first {
			w.Header().Set("Content-Type", out.ContentType(resp))
			w.WriteHeader(http.StatusOK)
			if !raw {
				io.WriteString(w, `{"data":"`)
			}
		}
		if raw {
			_, err = w.Write(data)
		} else {
			if need := enc.EncodedLen(len(data)); cap(text) < need {
				text = make([]byte, need)
			}
			text = text[:enc.EncodedLen(len(data))]
			enc.Encode(text, data)
			_, err = w.Write(text)
		}
		if err != nil {
			return // the client went away
		}
		off += int64(len(data))
		left -= int64(len(data))
		if int64(len(data)) < n || left <= 0 {
			break
		}
	}
	if !raw {
		tail := `"}`
		if withCRC {
			tail = `","crc32c":` + strconv.FormatUint(uint64(crc), 10) + `}`
		}
		io.WriteString(w, tail)
	}
}

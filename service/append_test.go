package service

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/store"
)

// TestAppendREST appends through both REST forms and checks the offset in
// the body and the header, and the refusals of a raw append's body.
func TestAppendREST(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxRequestBytes = 1024 })
	cases := []struct {
		name       string
		path, body string
		header     map[string]string
		wantStatus int
		wantOffset string // the header and the body's offset; "" when refused
	}{
		{"raw", "/v1/files/log:append", "hello", octetHeader, http.StatusOK, "0"},
		{"json", "/v1/files/log:append", `{"data":"IHdvcmxk"}`, nil, http.StatusOK, "5"},
		{"raw, synced, conditional", "/v1/files/log:append?sync=data&expected_offset=11", "!", octetHeader, http.StatusOK, "11"},
		{"raw, the end elsewhere", "/v1/files/log:append?expected_offset=3", "x", octetHeader, http.StatusBadRequest, ""},
		{"raw, too large", "/v1/files/log:append", strings.Repeat("x", 1025), octetHeader, http.StatusBadRequest, ""},
		{"raw, unknown parameter", "/v1/files/log:append?offset=3", "x", octetHeader, http.StatusBadRequest, ""},
		{"raw, zero-length", "/v1/files/log:append", "", octetHeader, http.StatusOK, "12"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, d.url+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if got := resp.StatusCode; got != c.wantStatus {
				t.Fatalf("status: got %d, want %d", got, c.wantStatus)
			}
			if got := resp.Header.Get(gateway.HeaderAppendOffset); got != c.wantOffset {
				t.Errorf("%s: got %q, want %q", gateway.HeaderAppendOffset, got, c.wantOffset)
			}
			if c.wantOffset == "" {
				return
			}
			var body struct{ Offset, Size string }
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if body.Offset != c.wantOffset {
				t.Errorf("body offset: got %q, want %q", body.Offset, c.wantOffset)
			}
		})
	}
	b, err := os.ReadFile(filepath.Join(d.root, "log"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "hello world!"; got != want {
		t.Errorf("file: got %q, want %q", got, want)
	}
}

// TestAppendRESTNeedsLength: a chunked raw append has no length to
// reserve, and is refused with 411 before its body is read.
func TestAppendRESTNeedsLength(t *testing.T) {
	d := startDaemon(t, nil)
	resp, err := rawRequest(strings.TrimPrefix(d.url, "http://"),
		"POST /v1/files/log:append HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
		[]string{"1\r\nx\r\n0\r\n\r\n"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, want := resp.StatusCode, http.StatusLengthRequired; got != want {
		t.Errorf("status: got %d, want %d", got, want)
	}
}

// TestAppendGRPC appends from many goroutines over gRPC, some with
// CRC-32C, some resent with their id, and checks that the offsets tile
// the file and that a wrong CRC-32C writes nothing.
func TestAppendGRPC(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	castagnoliTable := crc32.MakeTable(crc32.Castagnoli)
	bad := uint32(1)
	if _, err := d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("x"), Crc32C: &bad}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wrong CRC-32C: got %v, want INVALID_ARGUMENT", err)
	}
	const writers, each = 8, 20
	var mu sync.Mutex
	offsets := map[int64]string{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				data := fmt.Sprintf("<%d.%d>", w, i)
				sum := crc32.Checksum([]byte(data), castagnoliTable)
				req := &filewritev1.AppendRequest{Path: "log", Data: []byte(data), Crc32C: &sum, AppendId: data}
				first, err := d.client.Append(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				again, err := d.client.Append(ctx, req)
				if err != nil || again.GetOffset() != first.GetOffset() {
					t.Errorf("resend of %s: got %v, %v, want offset %d", data, again, err, first.GetOffset())
				}
				mu.Lock()
				offsets[first.GetOffset()] = data
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(filepath.Join(d.root, "log"))
	if err != nil {
		t.Fatal(err)
	}
	var rebuilt strings.Builder
	for off := int64(0); off < int64(len(b)); {
		data, ok := offsets[off]
		if !ok {
			t.Fatalf("no append landed at %d: the offsets do not tile the file", off)
		}
		rebuilt.WriteString(data)
		off += int64(len(data))
	}
	if got := rebuilt.String(); got != string(b) || len(offsets) != writers*each {
		t.Errorf("file %q, rebuilt from %d offsets %q", b, len(offsets), got)
	}
}

// TestStreamAppend mixes appends with positional writes on one stream:
// each append lands after every write read before it, the acks say where,
// and an append with an offset is refused.
func TestStreamAppend(t *testing.T) {
	for _, policy := range []string{"exclusive", "unlocked-below-eof"} {
		t.Run(policy, func(t *testing.T) {
			d := startDaemon(t, func(c *Config) {
				p, err := store.ParsePolicy(policy)
				if err != nil {
					t.Fatal(err)
				}
				c.Store.Policy = p
			})
			ctx := testContext(t)
			stream, err := d.client.WriteStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			w := func(id uint64, off int64, data string, app bool) *filewritev1.StreamWrite {
				return &filewritev1.StreamWrite{Id: id, Offset: off, Data: []byte(data), Append: app, Sync: filewritev1.SyncMode_SYNC_MODE_DATA}
			}
			msgs := [][]*filewritev1.StreamWrite{
				{w(1, 0, "aaaa", false), w(2, 0, "bb", true), w(3, 0, "cc", true)},
				{w(4, 100, "z", false), w(5, 0, "dd", true), w(6, 3, "x", true), w(7, 0, "", true)},
			}
			for i, m := range msgs {
				req := &filewritev1.WriteStreamRequest{Writes: m}
				if i == 0 {
					req.Path = "log"
				}
				if err := stream.Send(req); err != nil {
					t.Fatal(err)
				}
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			got := map[uint64]*filewritev1.StreamAck{}
			for {
				resp, err := stream.Recv()
				if err != nil {
					break
				}
				for _, a := range resp.GetAcks() {
					got[a.GetId()] = a
				}
			}
			for _, c := range []struct {
				id   uint64
				off  int64
				code codes.Code
			}{{1, 0, codes.OK}, {2, 4, codes.OK}, {3, 6, codes.OK}, {4, 100, codes.OK}, {5, 101, codes.OK}, {6, 0, codes.InvalidArgument}, {7, 103, codes.OK}} {
				a := got[c.id]
				if a == nil {
					t.Errorf("write %d: no ack", c.id)
					continue
				}
				if code := status.FromProto(a.GetStatus()).Code(); code != c.code {
					t.Errorf("write %d: %v, want %v", c.id, a.GetStatus(), c.code)
				}
				if c.code == codes.OK && a.GetOffset() != c.off {
					t.Errorf("write %d: acked at offset %d, want %d", c.id, a.GetOffset(), c.off)
				}
			}
			b, err := os.ReadFile(filepath.Join(d.root, "log"))
			if err != nil {
				t.Fatal(err)
			}
			if want := "aaaabbcc" + strings.Repeat("\x00", 92) + "zdd"; string(b) != want {
				t.Errorf("file: got %q, want %q", b, want)
			}
		})
	}
}

// streamAppendOf is an append of data with appendID ("" for none), synced,
// with its CRC-32C.
func streamAppendOf(id uint64, appendID, data string) *filewritev1.StreamWrite {
	w := streamWriteOf(id, 0, []byte(data), filewritev1.SyncMode_SYNC_MODE_DATA)
	w.Append, w.AppendId = true, appendID
	return w
}

// TestStreamAppendID: a stream append with an append_id goes through the
// daemon's id window as a unary Append does. Resent on the same stream, on
// a new one, or as a unary Append, it is acked with the first one's offset
// and its bytes are in the file once.
func TestStreamAppendID(t *testing.T) {
	for _, policy := range []string{"exclusive", "unlocked-below-eof"} {
		t.Run(policy, func(t *testing.T) {
			d := startDaemon(t, func(c *Config) {
				p, err := store.ParsePolicy(policy)
				if err != nil {
					t.Fatal(err)
				}
				c.Store.Policy = p
			})
			ctx := testContext(t)
			type want struct {
				id  uint64
				off int64
			}
			for _, round := range []struct {
				name   string
				writes [][]*filewritev1.StreamWrite // a message each
				want   []want
			}{
				{"first stream", [][]*filewritev1.StreamWrite{
					{streamAppendOf(1, "", "head|"), streamAppendOf(2, "a", "once|")},
					{streamAppendOf(3, "a", "once|"), streamAppendOf(4, "", "mid|")}, // 3 resends 2
				}, []want{{1, 0}, {2, 5}, {3, 5}, {4, 10}}},
				{"second stream", [][]*filewritev1.StreamWrite{
					{streamAppendOf(1, "a", "once|"), streamAppendOf(2, "b", "tail")},
				}, []want{{1, 5}, {2, 14}}},
			} {
				stream := openStream(t, ctx, d.client, "log")
				for _, m := range round.writes {
					if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: m}); err != nil {
						t.Fatal(err)
					}
				}
				acks := closeAndAckAll(t, stream)
				for _, w := range round.want {
					a := acks[w.id]
					if a == nil || a.GetStatus() != nil || a.GetOffset() != w.off {
						t.Errorf("%s, write %d: got ack %v, want offset %d", round.name, w.id, a, w.off)
					}
				}
			}
			// The window is the path's, whichever way the first came.
			resp, err := d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("tail"), AppendId: "b"})
			if err != nil || resp.GetOffset() != 14 {
				t.Errorf("a unary resend of a stream append: got %v, %v, want offset 14", resp, err)
			}
			b, err := os.ReadFile(filepath.Join(d.root, "log"))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := string(b), "head|once|mid|tail"; got != want {
				t.Errorf("file: got %q, want %q", got, want)
			}
		})
	}
}

// TestStreamAppendIDRefused: an append_id on a positional write, one over
// store.MaxAppendIDLen, and one reused with other data are refused in the
// write's ack, as the unary Append refuses them; the stream goes on, and
// nothing of the refused write is in the file.
func TestStreamAppendIDRefused(t *testing.T) {
	ctx := testContext(t)
	long := strings.Repeat("i", store.MaxAppendIDLen+1)
	positional := streamWriteOf(2, 1, []byte("p"), filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
	positional.AppendId = "p-1"
	for _, c := range []struct {
		name  string
		write *filewritev1.StreamWrite
		// unary is the same refusal from the unary Append, nil when it
		// has no counterpart there.
		unary *filewritev1.AppendRequest
		want  filewritev1.ErrorReason
	}{
		{"append_id without append", positional, nil, filewritev1.ErrorReason_REQUEST_MALFORMED},
		{"append_id too long", streamAppendOf(2, long, "t"), &filewritev1.AppendRequest{Path: "log", Data: []byte("t"), AppendId: long}, filewritev1.ErrorReason_REQUEST_MALFORMED},
		{"append_id reused with other data", streamAppendOf(2, "first", "other"), &filewritev1.AppendRequest{Path: "log", Data: []byte("other"), AppendId: "first"}, filewritev1.ErrorReason_APPEND_ID_REUSED},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startDaemon(t, nil)
			stream := openStream(t, ctx, d.client, "log")
			msgs := [][]*filewritev1.StreamWrite{{streamAppendOf(1, "first", "x")}, {c.write, streamAppendOf(3, "", "y")}}
			for _, m := range msgs {
				if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: m}); err != nil {
					t.Fatal(err)
				}
			}
			acks := closeAndAckAll(t, stream)
			got := status.FromProto(acks[2].GetStatus()).Err()
			if status.Code(got) != codes.InvalidArgument || errorinfo.Reason(got) != c.want.String() {
				t.Errorf("got %v (reason %q), want INVALID_ARGUMENT, reason %s", got, errorinfo.Reason(got), c.want)
			}
			if c.unary != nil {
				_, err := d.client.Append(ctx, c.unary)
				if status.Code(err) != status.Code(got) || errorinfo.Reason(err) != errorinfo.Reason(got) {
					t.Errorf("the unary Append: got %v, the stream %v: want the same refusal", err, got)
				}
			}
			if a := acks[3]; a.GetStatus() != nil || a.GetOffset() != 1 {
				t.Errorf("the append after it: got %v, want offset 1", a)
			}
			b, err := os.ReadFile(filepath.Join(d.root, "log"))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != "xy" {
				t.Errorf("file: got %q, want %q", b, "xy")
			}
		})
	}
}

// TestAppendIDTooLong: an append_id over store.MaxAppendIDLen is refused
// alike by the unary Append, a stream append and a raw REST append: a
// malformed request (not a bad range) naming the field and the limit, with
// nothing written.
func TestAppendIDTooLong(t *testing.T) {
	ctx := testContext(t)
	d := startDaemon(t, nil)
	long := strings.Repeat("i", store.MaxAppendIDLen+1)
	wantMD := map[string]string{errorinfo.KeyField: "append_id", errorinfo.KeyLimit: fmt.Sprint(store.MaxAppendIDLen)}
	check := func(via string, st *status.Status) {
		t.Helper()
		info := errorinfo.From(st.Err())
		if st.Code() != codes.InvalidArgument || info.GetReason() != filewritev1.ErrorReason_REQUEST_MALFORMED.String() {
			t.Errorf("%s: got %v (reason %q), want INVALID_ARGUMENT, REQUEST_MALFORMED", via, st.Err(), info.GetReason())
		}
		for k, want := range wantMD {
			if got := info.GetMetadata()[k]; got != want {
				t.Errorf("%s: metadata %q: got %q, want %q", via, k, got, want)
			}
		}
	}

	_, err := d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("u"), AppendId: long})
	check("unary", status.Convert(err))

	stream := openStream(t, ctx, d.client, "log")
	if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{streamAppendOf(1, long, "s")}}); err != nil {
		t.Fatal(err)
	}
	acks := closeAndAckAll(t, stream)
	check("stream", status.FromProto(acks[1].GetStatus()))

	res := d.rest(t, "POST", "/v1/files/log:append?append_id="+long, "r", octetHeader)
	if res.status != http.StatusBadRequest {
		t.Errorf("REST: HTTP %d, want 400 (%s)", res.status, res.body)
	}
	check("REST", restStatus(t, res.body))

	if b, err := os.ReadFile(filepath.Join(d.root, "log")); err == nil && len(b) > 0 {
		t.Errorf("file: got %q, want nothing written", b)
	}
}

// TestAppendCRCMismatch: a unary Append whose crc32c is wrong is refused
// naming its own field (crc32c, where a stream names writes.crc32c), and
// writes nothing.
func TestAppendCRCMismatch(t *testing.T) {
	ctx := testContext(t)
	d := startDaemon(t, nil)
	sum := crc32.Checksum([]byte("other"), crc32.MakeTable(crc32.Castagnoli))
	_, err := d.client.Append(ctx, &filewritev1.AppendRequest{Path: "log", Data: []byte("data"), Crc32C: &sum})
	info := errorinfo.From(err)
	if status.Code(err) != codes.InvalidArgument || info.GetReason() != filewritev1.ErrorReason_CRC_MISMATCH.String() {
		t.Fatalf("got %v (reason %q), want INVALID_ARGUMENT, CRC_MISMATCH", err, info.GetReason())
	}
	if got, want := info.GetMetadata()[errorinfo.KeyField], "crc32c"; got != want {
		t.Errorf("field: got %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(d.root, "log")); !os.IsNotExist(err) {
		t.Errorf("the file: got %v, want none created", err)
	}
}

package service

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

type writeStreamClient = grpc.BidiStreamingClient[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]

// openStream opens a WriteStream on path and waits for the server's answer
// to the first message: the file is open.
func openStream(t *testing.T, ctx context.Context, client filewritev1.FileServiceClient, path string) writeStreamClient {
	t.Helper()
	stream, err := client.WriteStream(ctx)
	if err != nil {
		t.Fatalf("WriteStream: %v", err)
	}
	if err := stream.Send(&filewritev1.WriteStreamRequest{Path: path}); err != nil {
		t.Fatalf("send the first message: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("the answer to the first message: %v", err)
	}
	if len(resp.GetAcks()) != 0 {
		t.Fatalf("the answer to a first message without writes has acks: %v", resp.GetAcks())
	}
	return stream
}

// streamWriteOf is a StreamWrite with the data's CRC-32C.
func streamWriteOf(id uint64, off int64, data []byte, sync filewritev1.SyncMode) *filewritev1.StreamWrite {
	sum := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	return &filewritev1.StreamWrite{Id: id, Offset: off, Data: data, Sync: sync, Crc32C: &sum}
}

// streamEnd is what a stream answered until it ended.
type streamEnd struct {
	acks      []*filewritev1.StreamAck // in arrival order
	responses []int                    // acks per response
	err       error                    // nil: OK
}

// recvAll reads the stream to its end.
func recvAll(stream writeStreamClient) streamEnd {
	var e streamEnd
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return e
		}
		if err != nil {
			e.err = err
			return e
		}
		e.acks = append(e.acks, resp.GetAcks()...)
		e.responses = append(e.responses, len(resp.GetAcks()))
	}
}

// byID indexes acks by id, failing the test on a duplicate.
func byID(t *testing.T, acks []*filewritev1.StreamAck) map[uint64]*filewritev1.StreamAck {
	t.Helper()
	m := make(map[uint64]*filewritev1.StreamAck, len(acks))
	for _, a := range acks {
		if _, dup := m[a.GetId()]; dup {
			t.Errorf("write %d acked twice", a.GetId())
		}
		m[a.GetId()] = a
	}
	return m
}

// closeAndAckAll half-closes stream, reads every ack until the stream
// ends, which it must with OK, and returns the acks by write ID.
func closeAndAckAll(t *testing.T, stream writeStreamClient) map[uint64]*filewritev1.StreamAck {
	t.Helper()
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	e := recvAll(stream)
	if e.err != nil {
		t.Fatalf("stream ended with %v, want OK", e.err)
	}
	return byID(t, e.acks)
}

// overlay writes p at off into content, growing it as a file would.
func overlay(content []byte, off int64, p []byte) []byte {
	if end := int(off) + len(p); end > len(content) {
		content = append(content, make([]byte, end-len(content))...)
	}
	copy(content[off:], p)
	return content
}

// TestWriteStreamOverlapsLandInOrder: many overlapping writes, many to a
// message, under every policy: the file ends as if they were applied one
// by one in the order sent, and every write is acked once, OK, with a
// size at least its end.
func TestWriteStreamOverlapsLandInOrder(t *testing.T) {
	for _, policy := range store.Policies() {
		t.Run(policy.String(), func(t *testing.T) {
			d := startDaemon(t, func(c *Config) { c.Store.Policy = policy })
			ctx := testContext(t)
			stream := openStream(t, ctx, d.client, "order/f")
			rng := rand.New(rand.NewPCG(uint64(policy), 9))
			const messages, perMessage = 10, 40
			var model []byte
			type sent struct{ n, end int64 }
			writes := map[uint64]sent{}
			id := uint64(0)
			for range messages {
				req := &filewritev1.WriteStreamRequest{}
				for range perMessage {
					// Small offsets and long writes: most overlap others.
					off := rng.Int64N(48 << 10)
					data := make([]byte, 1+rng.IntN(16<<10))
					for i := range data {
						data[i] = byte(rng.Uint32())
					}
					sync := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
					if rng.IntN(8) == 0 {
						sync = filewritev1.SyncMode_SYNC_MODE_DATA
					}
					req.Writes = append(req.Writes, streamWriteOf(id, off, data, sync))
					model = overlay(model, off, data)
					writes[id] = sent{int64(len(data)), off + int64(len(data))}
					id++
				}
				if err := stream.Send(req); err != nil {
					t.Fatal(err)
				}
			}
			acks := closeAndAckAll(t, stream)
			if got, want := len(acks), messages*perMessage; got != want {
				t.Errorf("got %d acks, want %d", got, want)
			}
			for id, a := range acks {
				w := writes[id]
				if a.GetStatus() != nil || a.GetBytesWritten() != w.n || a.GetSize() < w.end {
					t.Errorf("write %d: ack %v, want OK, %d bytes, a size of at least %d", id, a, w.n, w.end)
				}
			}
			if got := d.onDisk(t, "order/f"); !slices.Equal(got, model) {
				t.Errorf("the file differs from the writes applied in the order sent (%d bytes, want %d)", len(got), len(model))
			}
		})
	}
}

// gateOf is a channel to hold faultfs calls with, opened when the test ends
// at the latest.
func gateOf(t *testing.T) (gate chan struct{}, open func()) {
	gate = make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	return gate, open
}

// TestWriteStreamAcksOutOfOrder: a write held inside the store does not
// hold back the ack of a later write that does not overlap it; and acks
// that become ready together travel in one response.
func TestWriteStreamAcksOutOfOrder(t *testing.T) {
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) { ffs = withFaultFS(c) })
	ctx := testContext(t)
	const path = "acks/f"
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: make([]byte, 64<<10)}); err != nil {
		t.Fatal(err)
	}
	stream := openStream(t, ctx, d.client, path)
	gate, open := gateOf(t)
	held := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: path, Off: 0, Len: 4096, Hold: gate})
	send := func(ws ...*filewritev1.StreamWrite) {
		t.Helper()
		if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: ws}); err != nil {
			t.Fatal(err)
		}
	}
	send(streamWriteOf(1, 0, testutil.AllBytes(4096), 0), streamWriteOf(2, 8192, testutil.AllBytes(4096), 0))
	testutil.WaitFor(t, "write 1 to be held in the store", func() bool { return held.Hits() == 1 })
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := ackIDs(resp); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("while write 1 is held: acks %v, want [2]", got)
	}
	open()
	if resp, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := ackIDs(resp); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("once write 1 is let go: acks %v, want [1]", got)
	}

	// Synced writes applied while a sync is held share the next one, and
	// their acks one response.
	syncGate, openSync := gateOf(t)
	heldSync := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpSync, Hold: syncGate, Times: 1})
	send(streamWriteOf(3, 0, []byte("three"), filewritev1.SyncMode_SYNC_MODE_DATA))
	testutil.WaitFor(t, "write 3's sync to be held", func() bool { return heldSync.Hits() == 1 })
	var batch []*filewritev1.StreamWrite
	for id := uint64(4); id < 12; id++ {
		batch = append(batch, streamWriteOf(id, int64(id)*4096, []byte{byte(id)}, filewritev1.SyncMode_SYNC_MODE_DATA))
	}
	send(batch...)
	testutil.WaitFor(t, "writes 4 to 11 to reach the file", func() bool {
		b := d.onDisk(t, path)
		for id := 4; id < 12; id++ {
			if b[id*4096] != byte(id) {
				return false
			}
		}
		return true
	})
	openSync()
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	e := recvAll(stream)
	if e.err != nil {
		t.Fatalf("stream ended with %v, want OK", e.err)
	}
	acks := byID(t, e.acks)
	for id := uint64(3); id < 12; id++ {
		if a := acks[id]; a == nil || a.GetStatus() != nil {
			t.Errorf("write %d: ack %v, want OK", id, a)
		}
	}
	if most := slices.Max(e.responses); most < 8 {
		t.Errorf("acks per response %v: want the 8 writes that shared a sync in one response", e.responses)
	}
}

func ackIDs(resp *filewritev1.WriteStreamResponse) []uint64 {
	var ids []uint64
	for _, a := range resp.GetAcks() {
		ids = append(ids, a.GetId())
	}
	return ids
}

// TestWriteStreamPerWriteErrors: each write is validated, limited and
// failed like a unary Write, its error comes in its ack, and the stream
// goes on. A refused write (a CRC mismatch included) writes nothing; a
// write that fails part-way reports the bytes that reached the file and
// the size after.
func TestWriteStreamPerWriteErrors(t *testing.T) {
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) {
		ffs = withFaultFS(c)
		c.Store.MaxRequestBytes = 64 << 10
		c.Store.MaxFileSize = 1 << 20
	})
	ctx := testContext(t)
	const path = "errs/f"
	(*ffs).Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: path, Off: 8192, After: 100, Err: syscall.ENOSPC})
	badCRC := streamWriteOf(6, 100, []byte("zzz"), 0)
	*badCRC.Crc32C ^= 1
	tests := []struct {
		name     string
		w        *filewritev1.StreamWrite
		want     codes.Code
		written  int64
		wantSize int64 // the size the ack reports
	}{
		{"written", streamWriteOf(1, 0, []byte("abc"), 0), codes.OK, 3, 3},
		{"negative offset", streamWriteOf(2, -1, []byte("x"), 0), codes.InvalidArgument, 0, 3},
		{"over --max-request-bytes", streamWriteOf(3, 0, make([]byte, 64<<10+1), 0), codes.InvalidArgument, 0, 3},
		{"past --max-file-size", streamWriteOf(4, 1<<20, []byte("x"), 0), codes.OutOfRange, 0, 3},
		{"unknown sync mode", streamWriteOf(5, 0, []byte("x"), 99), codes.InvalidArgument, 0, 3},
		{"CRC-32C mismatch", badCRC, codes.InvalidArgument, 0, 3},
		{"no CRC-32C", &filewritev1.StreamWrite{Id: 7, Offset: 3, Data: []byte("def")}, codes.OK, 3, 6},
		{"disk full part-way", streamWriteOf(8, 8192, testutil.AllBytes(4096), 0), codes.ResourceExhausted, 100, 8292},
	}
	stream := openStream(t, ctx, d.client, path)
	// One message at a time, so that each ack's size is predictable.
	for _, tt := range tests {
		if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{tt.w}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: the stream ended: %v", tt.name, err)
		}
		if len(resp.GetAcks()) != 1 || resp.GetAcks()[0].GetId() != tt.w.GetId() {
			t.Fatalf("%s: acks %v, want write %d's", tt.name, resp.GetAcks(), tt.w.GetId())
		}
		a := resp.GetAcks()[0]
		if got := codes.Code(a.GetStatus().GetCode()); got != tt.want {
			t.Errorf("%s: code %v (%q), want %v", tt.name, got, a.GetStatus().GetMessage(), tt.want)
		}
		if a.GetBytesWritten() != tt.written || a.GetSize() != tt.wantSize {
			t.Errorf("%s: %d bytes written, size %d; want %d, %d", tt.name, a.GetBytesWritten(), a.GetSize(), tt.written, tt.wantSize)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if e := recvAll(stream); e.err != nil || len(e.acks) != 0 {
		t.Errorf("after the half-close: %d more acks, end %v; want none and OK", len(e.acks), e.err)
	}
	want := overlay([]byte("abcdef"), 8192, testutil.AllBytes(100))
	if got := d.onDisk(t, path); !slices.Equal(got, want) {
		t.Errorf("file: %d bytes, want %d: abcdef, zeros, and the 100 bytes that fit", len(got), len(want))
	}
}

// TestWriteStreamErrors: a stream error ends the stream with its code,
// after every write of the messages read before it was applied and acked;
// the message that caused it is refused whole.
func TestWriteStreamErrors(t *testing.T) {
	w := func(id uint64, off int64) *filewritev1.StreamWrite {
		return streamWriteOf(id, off, []byte(fmt.Sprintf("<%d>", id)), 0)
	}
	tests := []struct {
		name      string
		configure func(*Config)
		// messages before the one that fails; the first names path.
		before []*filewritev1.WriteStreamRequest
		bad    *filewritev1.WriteStreamRequest
		want   codes.Code
	}{
		{
			name: "no path in the first message",
			bad:  &filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{w(1, 0)}},
			want: codes.InvalidArgument,
		},
		{
			name: "an invalid path",
			bad:  &filewritev1.WriteStreamRequest{Path: "../f", Writes: []*filewritev1.StreamWrite{w(1, 0)}},
			want: codes.InvalidArgument,
		},
		{
			name: "a directory",
			bad:  &filewritev1.WriteStreamRequest{Path: "dir", Writes: []*filewritev1.StreamWrite{w(1, 0)}},
			want: codes.InvalidArgument,
		},
		{
			name: "another path later",
			before: []*filewritev1.WriteStreamRequest{
				{Path: "f", Writes: []*filewritev1.StreamWrite{w(1, 0), w(2, 10)}},
				{Path: "f", Writes: []*filewritev1.StreamWrite{w(3, 20)}},
			},
			bad:  &filewritev1.WriteStreamRequest{Path: "g", Writes: []*filewritev1.StreamWrite{w(4, 30)}},
			want: codes.InvalidArgument,
		},
		{
			name: "a duplicate id in one message",
			before: []*filewritev1.WriteStreamRequest{
				{Path: "f", Writes: []*filewritev1.StreamWrite{w(1, 0), w(2, 10)}},
			},
			bad:  &filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{w(3, 20), w(4, 30), w(3, 40)}},
			want: codes.InvalidArgument,
		},
		{
			name:      "a message over the size limit",
			configure: func(c *Config) { c.Store.MaxRequestBytes = 4096 },
			before: []*filewritev1.WriteStreamRequest{
				{Path: "f", Writes: []*filewritev1.StreamWrite{w(1, 0), w(2, 10)}},
			},
			bad: &filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{
				streamWriteOf(3, 100, make([]byte, 4096+status.MessageOverhead), 0)}},
			want: codes.InvalidArgument,
		},
		{
			name: "more writes than a message may carry",
			before: []*filewritev1.WriteStreamRequest{
				{Path: "f", Writes: []*filewritev1.StreamWrite{w(1, 0), w(2, 10)}},
			},
			bad:  tinyWrites(100, streamwire.MaxWritesPerMessage+1),
			want: codes.InvalidArgument,
		},
		{
			name:      "no room for another open file",
			configure: func(c *Config) { c.Store.MaxOpenFiles = 1 },
			bad:       &filewritev1.WriteStreamRequest{Path: "f", Writes: []*filewritev1.StreamWrite{w(1, 0)}},
			want:      codes.ResourceExhausted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := startDaemon(t, tt.configure)
			ctx := testContext(t)
			if err := os.Mkdir(filepath.Join(d.root, "dir"), 0o755); err != nil {
				t.Fatal(err)
			}
			if tt.name == "no room for another open file" {
				// Another stream holds the only file the store may open.
				openStream(t, ctx, d.client, "other")
			}
			stream, err := d.client.WriteStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var model []byte
			want := map[uint64]bool{}
			for _, m := range append(tt.before, tt.bad) {
				if err := stream.Send(m); err != nil {
					t.Fatal(err)
				}
				if m == tt.bad {
					break
				}
				for _, w := range m.Writes {
					model = overlay(model, w.Offset, w.Data)
					want[w.Id] = true
				}
			}
			e := recvAll(stream)
			if got := grpcstatus.Code(e.err); got != tt.want {
				t.Errorf("stream ended with %v, want %v", e.err, tt.want)
			}
			for id, a := range byID(t, e.acks) {
				if !want[id] || a.GetStatus() != nil {
					t.Errorf("ack %v: want an OK ack of each write before the bad message, and no other", a)
				}
				delete(want, id)
			}
			for id := range want {
				t.Errorf("write %d of an earlier message was not acked", id)
			}
			got, err := os.ReadFile(filepath.Join(d.root, "f"))
			if errors.Is(err, fs.ErrNotExist) && model == nil {
				return
			}
			if err != nil || !slices.Equal(got, model) {
				t.Errorf("file f: %q (%v), want %q: the earlier messages' writes and nothing of the bad one", got, err, model)
			}
		})
	}
}

// TestWriteStreamDuplicateOfUnackedID: an id may not be reused while its
// write waits for its ack; once acked, it may.
func TestWriteStreamDuplicateOfUnackedID(t *testing.T) {
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) { ffs = withFaultFS(c) })
	ctx := testContext(t)
	stream := openStream(t, ctx, d.client, "dup/f")
	send := func(ws ...*filewritev1.StreamWrite) {
		t.Helper()
		if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: ws}); err != nil {
			t.Fatal(err)
		}
	}
	// Reused after its ack: fine.
	send(streamWriteOf(0, 0, []byte("first"), 0))
	if resp, err := stream.Recv(); err != nil || !slices.Equal(ackIDs(resp), []uint64{0}) {
		t.Fatalf("ack of write 0: %v, %v", resp, err)
	}
	gate, open := gateOf(t)
	held := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "dup/f", Hold: gate})
	send(streamWriteOf(0, 0, []byte("again"), 0))
	testutil.WaitFor(t, "the second write 0 to be held", func() bool { return held.Hits() == 1 })
	send(streamWriteOf(0, 100, []byte("third"), 0))
	testutil.WaitFor(t, "the server to read the third message", func() bool {
		return histogramCount(d.scrape(t), "filewrite_stream_message_writes") == 4 // the first, without writes, and three
	})
	open()
	e := recvAll(stream)
	if got := grpcstatus.Code(e.err); got != codes.InvalidArgument {
		t.Errorf("stream ended with %v, want %v", e.err, codes.InvalidArgument)
	}
	if len(e.acks) != 1 || e.acks[0].GetId() != 0 || e.acks[0].GetStatus() != nil {
		t.Errorf("acks %v: want the held write 0's, OK", e.acks)
	}
	if got := string(d.onDisk(t, "dup/f")); got != "again" {
		t.Errorf("file: %q, want %q", got, "again")
	}
}

// histogramCount is the count of the histogram called name (summed over
// its series).
func histogramCount(fams map[string]*dto.MetricFamily, name string) uint64 {
	var n uint64
	for _, m := range fams[name].GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// TestWriteStreamHalfClose: the client half-closes at once; every write
// it sent is applied and acked, synced ones after their sync, and the
// stream ends OK.
func TestWriteStreamHalfClose(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	stream := openStream(t, ctx, d.client, "half/f")
	var model []byte
	id := uint64(0)
	for m := range 5 {
		req := &filewritev1.WriteStreamRequest{}
		for i := range 20 {
			data := []byte(fmt.Sprintf("%d.%d;", m, i))
			req.Writes = append(req.Writes, streamWriteOf(id, int64(id)*16, data, filewritev1.SyncMode(i%3)))
			model = overlay(model, int64(id)*16, data)
			id++
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	acks := closeAndAckAll(t, stream)
	for i := range id {
		if a := acks[i]; a == nil || a.GetStatus() != nil {
			t.Errorf("write %d: ack %v, want OK", i, a)
		}
	}
	if got := d.onDisk(t, "half/f"); !slices.Equal(got, model) {
		t.Errorf("file: %q, want %q", got, model)
	}
}

// TestReadCRC: Read returns the CRC-32C of the data it returns.
func TestReadCRC(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	data := testutil.AllBytes(10000)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "crc", Data: data}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ off, length int64 }{{0, 10000}, {100, 50}, {9990, 100}, {20000, 10}} {
		resp, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: "crc", Offset: r.off, Length: r.length})
		if err != nil {
			t.Fatal(err)
		}
		want := crc32.Checksum(resp.GetData(), crc32.MakeTable(crc32.Castagnoli))
		if resp.Crc32C == nil || resp.GetCrc32C() != want {
			t.Errorf("Read(%d, %d): crc32c %v, want %#x", r.off, r.length, resp.Crc32C, want)
		}
	}
}

package rpc

import (
	"errors"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/service/internal/streamengine"
	"github.com/filewrite/filewrite/store"
)

// split cuts b into a BufferSlice of pieces of at most n bytes, as gRPC
// hands over a message that came in several frames.
func split(b []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		out = append(out, mem.SliceBuffer(append([]byte(nil), b[:k]...)))
		b = b[k:]
	}
	return out
}

// TestDecodeStreamRequest: the stream's own decoder reads what the
// generated code writes, in one piece or several, skips unknown fields,
// and refuses what does not parse.
func TestDecodeStreamRequest(t *testing.T) {
	crc := uint32(0xdeadbeef)
	msg := &filewritev1.WriteStreamRequest{Path: "a/b", OpenMode: filewritev1.OpenMode_OPEN_MODE_EXCLUSIVE, Writes: []*filewritev1.StreamWrite{
		{Id: 0, Offset: 0, Data: nil},
		{Id: 7, Offset: 4096, Data: []byte("hello"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA, Crc32C: &crc},
		{Id: math.MaxUint64, Offset: -1, Data: make([]byte, 1000), Sync: 42},
	}}
	wire, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	// An unknown field, and a known one with another wire type: both
	// skipped, as the generated code keeps them as unknown fields.
	extra := protowire.AppendTag(nil, 99, protowire.BytesType)
	extra = protowire.AppendString(extra, "later")
	extra = protowire.AppendTag(extra, streamwire.FieldRequestPath, protowire.VarintType)
	extra = protowire.AppendVarint(extra, 5)
	withUnknown := append(append([]byte(nil), wire...), extra...)

	for _, tt := range []struct {
		name  string
		data  mem.BufferSlice
		bad   bool
		check bool
	}{
		{"one buffer", split(wire, len(wire)), false, true},
		{"many buffers", split(wire, 7), false, true},
		{"unknown fields", split(withUnknown, len(withUnknown)), false, true},
		{"empty", nil, false, false},
		{"truncated", split(wire[:len(wire)-3], 100), true, false},
		{"bad UTF-8 path", split(protowire.AppendString(protowire.AppendTag(nil, streamwire.FieldRequestPath, protowire.BytesType), "\xff"), 10), true, false},
	} {
		var r streamRequest
		decodeStreamRequest(tt.data, &r)
		if got := r.err != nil; got != tt.bad {
			t.Errorf("%s: bad %v, want bad=%v", tt.name, r.err, tt.bad)
		}
		if r.size != tt.data.Len() {
			t.Errorf("%s: size %d, want %d", tt.name, r.size, tt.data.Len())
		}
		if !tt.check {
			continue
		}
		r.decodeWrites()
		if r.GetPath() != msg.Path || len(r.writes) != len(msg.Writes) {
			t.Fatalf("%s: path %q, %d writes; want %q, %d", tt.name, r.GetPath(), len(r.writes), msg.Path, len(msg.Writes))
		}
		if filewritev1.OpenMode(r.msg.OpenMode) != msg.OpenMode {
			t.Errorf("%s: open mode %v, want %v", tt.name, filewritev1.OpenMode(r.msg.OpenMode), msg.OpenMode)
		}
		for i, w := range r.writes {
			want := msg.Writes[i]
			if w.ID != want.Id || w.Off != want.Offset || string(w.Data) != string(want.Data) || w.syncRaw != want.Sync ||
				w.hasCRC != (want.Crc32C != nil) || w.crc != want.GetCrc32C() || w.Msg != &r {
				t.Errorf("%s: write %d = %+v, want %v", tt.name, i, w, want)
			}
		}
		for range r.writes {
			r.Applied()
		}
		if r.buf != nil {
			t.Errorf("%s: the received bytes were kept after every write was applied", tt.name)
		}
	}
}

// TestEncodeAcks: the acks the stream encodes itself decode, with the
// generated code, to the response they stand for.
func TestEncodeAcks(t *testing.T) {
	refused := status.Error(codes.InvalidArgument, "no")
	ws := []*streamengine.Write{
		{ID: 0},
		{ID: 5, Res: store.AppliedWrite{WriteResult: store.WriteResult{BytesWritten: 4096, Size: 1 << 40}}},
		{ID: math.MaxUint64, Res: store.AppliedWrite{WriteResult: store.WriteResult{BytesWritten: 100, Size: 8292}},
			Err: errors.Join(store.ErrNoSpace)},
		{ID: 9, Err: refused},
	}
	var m encodedMessage
	encodeAcks(ws, nil, &m)
	got := &filewritev1.WriteStreamResponse{}
	if err := proto.Unmarshal(m.data.Materialize(), got); err != nil {
		t.Fatal(err)
	}
	m.data.Free()
	want := &filewritev1.WriteStreamResponse{}
	for _, w := range ws {
		want.Acks = append(want.Acks, &filewritev1.StreamAck{Id: w.ID, BytesWritten: int64(w.Res.BytesWritten), Size: w.Res.Size, Status: ackStatus(w.Err)})
	}
	if !proto.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

package client

import (
	"math"
	"slices"
	"testing"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
)

// TestEncodeWrites: the sender's own encoding decodes, with the generated
// code, to the message it stands for, whether the writes' data is copied
// into it or (a Writer's pieces, large enough) held by it; a held piece
// lies in the message as the Writer's own buffer, and the message lets go
// of it when freed.
func TestEncodeWrites(t *testing.T) {
	piece := func(n int) *pieceBuf {
		bp := bufpool.Shared.Get(n)
		for i := range *bp {
			(*bp)[i] = byte(i)
		}
		return newPieceBuf(bp)
	}
	owned := func(off int64, pb *pieceBuf) *write {
		return &write{off: off, data: *pb.bp, sync: SyncData, crc: 7, buf: pb}
	}
	tests := []struct {
		name string
		ws   []*write
	}{
		{"copied", []*write{
			{off: 0, data: nil, sync: SyncNone, crc: 0},
			{off: 4096, data: []byte("hello"), sync: SyncData, crc: 0xdeadbeef},
			{off: -1, data: make([]byte, 300), sync: SyncFull, crc: 1},
			{off: math.MaxInt64, data: []byte{0}, sync: 7, crc: math.MaxUint32},
		}},
		{"held", []*write{owned(0, piece(1<<20))}},
		{"held and copied", []*write{
			{off: 4096, data: []byte("hello"), sync: SyncData, crc: 0xdeadbeef},
			owned(1<<20, piece(64<<10)),
			owned(2<<20, piece(100)), // below gRPC's pooling threshold: copied
			owned(3<<20, piece(4<<10)),
			{off: -1, data: make([]byte, 300), sync: SyncFull, crc: 1},
		}},
	}
	for _, tt := range tests {
		for _, first := range []uint64{0, 1, math.MaxUint64 - 5} {
			enc := encodeWrites(tt.ws, 0, first)
			got := &filewritev1.WriteStreamRequest{}
			if err := proto.Unmarshal(enc.data.Materialize(), got); err != nil {
				t.Fatalf("%s, first id %d: %v", tt.name, first, err)
			}
			want := &filewritev1.WriteStreamRequest{}
			for i, w := range tt.ws {
				crc := w.crc
				want.Writes = append(want.Writes, &filewritev1.StreamWrite{
					Id: first + uint64(i), Offset: w.off, Data: w.data, Sync: w.sync.proto(), Crc32C: &crc,
				})
			}
			if !proto.Equal(got, want) {
				t.Errorf("%s, first id %d:\n got  %v\n want %v", tt.name, first, got, want)
			}
			for _, w := range tt.ws {
				held := slices.ContainsFunc(enc.data, func(b mem.Buffer) bool {
					return b.Len() > 0 && unsafe.SliceData(b.ReadOnlyData()) == unsafe.SliceData(w.data)
				})
				if want := w.buf.shareable(); held != want {
					t.Errorf("%s: the message holds the %d bytes of the write at %d itself: %v, want %v", tt.name, len(w.data), w.off, held, want)
				}
			}
			enc.data.Free()
			for _, w := range tt.ws {
				if w.buf != nil {
					if got := w.buf.refs.Load(); got != 1 {
						t.Errorf("%s: after the message was freed, the write at %d has %d holds on its buffer, want 1 (its own)", tt.name, w.off, got)
					}
				}
			}
		}
	}
}

// TestDecodeAcks: the receiver's own decoder reads what the generated code
// writes, statuses included, in one piece or several.
func TestDecodeAcks(t *testing.T) {
	msg := &filewritev1.WriteStreamResponse{Acks: []*filewritev1.StreamAck{
		{},
		{Id: 3, BytesWritten: 4096, Size: 1 << 40},
		{Id: math.MaxUint64, BytesWritten: 100, Size: 8292, Status: status.New(codes.ResourceExhausted, "full").Proto()},
	}}
	wire, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	for _, pieces := range []mem.BufferSlice{{mem.SliceBuffer(wire)}, {mem.SliceBuffer(wire[:5]), mem.SliceBuffer(wire[5:])}} {
		var r ackResponse
		if err := r.decode(pieces); err != nil {
			t.Fatal(err)
		}
		if len(r.acks) != len(msg.Acks) {
			t.Fatalf("%d acks, want %d", len(r.acks), len(msg.Acks))
		}
		for i, a := range r.acks {
			want := msg.Acks[i]
			if a.id != want.Id || a.written != want.BytesWritten || a.size != want.Size ||
				status.Code(a.err) != codes.Code(want.GetStatus().GetCode()) {
				t.Errorf("ack %d = %+v, want %v", i, a, want)
			}
		}
	}
	var r ackResponse
	if err := r.decode(mem.BufferSlice{mem.SliceBuffer(wire[:len(wire)-2])}); err == nil {
		t.Error("a truncated response decoded")
	}
}

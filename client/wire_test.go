package client

import (
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// TestEncodeWrites: the sender's own encoding decodes, with the generated
// code, to the message it stands for.
func TestEncodeWrites(t *testing.T) {
	ws := []*write{
		{off: 0, data: nil, sync: SyncNone, crc: 0},
		{off: 4096, data: []byte("hello"), sync: SyncData, crc: 0xdeadbeef},
		{off: -1, data: make([]byte, 300), sync: SyncFull, crc: 1},
		{off: math.MaxInt64, data: []byte{0}, sync: 7, crc: math.MaxUint32},
	}
	for _, first := range []uint64{0, 1, math.MaxUint64 - 3} {
		enc := encodeWrites(ws, 0, first)
		got := &filewritev1.WriteStreamRequest{}
		if err := proto.Unmarshal(enc.data.Materialize(), got); err != nil {
			t.Fatalf("first id %d: %v", first, err)
		}
		enc.data.Free()
		want := &filewritev1.WriteStreamRequest{}
		for i, w := range ws {
			crc := w.crc
			want.Writes = append(want.Writes, &filewritev1.StreamWrite{
				Id: first + uint64(i), Offset: w.off, Data: w.data, Sync: w.sync.proto(), Crc32C: &crc,
			})
		}
		if !proto.Equal(got, want) {
			t.Errorf("first id %d:\n got  %v\n want %v", first, got, want)
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

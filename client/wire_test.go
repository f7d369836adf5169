package client

import (
	"math"
	"testing"

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
		enc := encodeWrites(ws, first)
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

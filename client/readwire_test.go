package client

import (
	"bytes"
	"hash/crc32"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// TestReadReplyDecode: a Read's reply decodes into the caller's slice
// whatever order its fields come in, across the buffers gRPC received it
// in, past fields it does not know; data longer than asked is refused,
// and what does not decode is an error.
func TestReadReplyDecode(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 20000)
	sum := crc32.Checksum(data, castagnoli)
	field := func(b []byte, num protowire.Number) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, data)
	}
	crc := func(b []byte) []byte {
		b = protowire.AppendTag(b, 2, protowire.Fixed32Type)
		return protowire.AppendFixed32(b, sum)
	}
	unknown := func(b []byte) []byte {
		b = protowire.AppendTag(b, 9, protowire.VarintType)
		b = protowire.AppendVarint(b, 300)
		b = protowire.AppendTag(b, 10, protowire.BytesType)
		return protowire.AppendBytes(b, []byte("later"))
	}
	for _, tt := range []struct {
		name    string
		msg     []byte
		dst     int
		wantN   int
		wantCRC bool
		tooLong bool
		wantErr bool
	}{
		{name: "data, crc", msg: crc(field(nil, 1)), dst: len(data), wantN: len(data), wantCRC: true},
		{name: "crc, data", msg: field(crc(nil), 1), dst: len(data) + 5, wantN: len(data), wantCRC: true},
		{name: "unknown fields", msg: unknown(field(unknown(crc(nil)), 1)), dst: len(data), wantN: len(data), wantCRC: true},
		{name: "no crc", msg: field(nil, 1), dst: len(data), wantN: len(data)},
		{name: "empty", msg: nil, dst: 10},
		{name: "longer than asked", msg: crc(field(nil, 1)), dst: 10, wantCRC: true, tooLong: true},
		{name: "truncated", msg: field(nil, 1)[:1000], dst: len(data), wantErr: true},
		{name: "group", msg: protowire.AppendTag(nil, 3, protowire.StartGroupType), dst: 10, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// In pieces of 16 KiB, as gRPC's frames are.
			var bs mem.BufferSlice
			for b := tt.msg; len(b) > 0; b = b[min(len(b), 16<<10):] {
				bs = append(bs, mem.SliceBuffer(b[:min(len(b), 16<<10)]))
			}
			r := readReply{dst: make([]byte, tt.dst)}
			err := r.decode(bs)
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("decode: %v, want an error: %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if got, want := r.tooLong > 0, tt.tooLong; got != want {
				t.Errorf("tooLong %d, want one: %v", r.tooLong, want)
			}
			if r.n != tt.wantN || !bytes.Equal(r.dst[:r.n], data[:tt.wantN]) {
				t.Errorf("got %d bytes, want %d of the data", r.n, tt.wantN)
			}
			if r.hasCRC != tt.wantCRC || (r.hasCRC && r.crc != sum) {
				t.Errorf("crc %#x (sent: %v), want %#x (sent: %v)", r.crc, r.hasCRC, sum, tt.wantCRC)
			}
			if tt.wantN > 0 && r.sum != sum {
				t.Errorf("sum of the data %#x, want %#x", r.sum, sum)
			}
		})
	}
}

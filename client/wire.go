package client

import (
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The sender encodes each WriteStreamRequest itself, straight from the
// queued writes into a pooled buffer, instead of building a message of
// StreamWrites for the proto codec: no message per write to allocate, and
// the callers' bytes are read once, while their callers still wait (see
// fileStream.giveUp). streamCodec passes such a message to gRPC as it is;
// everything else goes through the proto codec.

// Field numbers of WriteStreamRequest and StreamWrite (filewrite.proto).
const (
	fieldWrites      = 2 // WriteStreamRequest.writes
	fieldWriteID     = 1 // StreamWrite.id
	fieldWriteOffset = 2
	fieldWriteData   = 3
	fieldWriteSync   = 4
	fieldWriteCRC    = 5
)

// encodedRequest is a WriteStreamRequest in wire form.
type encodedRequest struct{ data mem.BufferSlice }

type streamCodec struct{ encoding.CodecV2 }

func newStreamCodec() streamCodec { return streamCodec{encoding.GetCodecV2(protocodec.Name)} }

func (c streamCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedRequest); ok {
		return e.data, nil
	}
	return c.CodecV2.Marshal(v)
}

// streamWriteSize is the size of one StreamWrite, without its own tag and
// length.
func streamWriteSize(id uint64, w *write) int {
	n := protowire.SizeTag(fieldWriteData) + protowire.SizeBytes(len(w.data)) +
		protowire.SizeTag(fieldWriteCRC) + protowire.SizeFixed32()
	if id != 0 {
		n += protowire.SizeTag(fieldWriteID) + protowire.SizeVarint(id)
	}
	if w.off != 0 {
		n += protowire.SizeTag(fieldWriteOffset) + protowire.SizeVarint(uint64(w.off))
	}
	if s := uint64(w.sync.proto()); s != 0 {
		n += protowire.SizeTag(fieldWriteSync) + protowire.SizeVarint(s)
	}
	return n
}

// encodeWrites encodes a WriteStreamRequest (no path) carrying ws, with
// ids from firstID on, into a buffer of the pool.
func encodeWrites(ws []*write, firstID uint64) *encodedRequest {
	size := 0
	for i, w := range ws {
		n := streamWriteSize(firstID+uint64(i), w)
		size += protowire.SizeTag(fieldWrites) + protowire.SizeBytes(n)
	}
	pool := mem.DefaultBufferPool()
	bp := pool.Get(size)
	b := (*bp)[:0]
	for i, w := range ws {
		id := firstID + uint64(i)
		b = protowire.AppendTag(b, fieldWrites, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(streamWriteSize(id, w)))
		if id != 0 {
			b = protowire.AppendTag(b, fieldWriteID, protowire.VarintType)
			b = protowire.AppendVarint(b, id)
		}
		if w.off != 0 {
			b = protowire.AppendTag(b, fieldWriteOffset, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(w.off))
		}
		b = protowire.AppendTag(b, fieldWriteData, protowire.BytesType)
		b = protowire.AppendBytes(b, w.data)
		if s := uint64(w.sync.proto()); s != 0 {
			b = protowire.AppendTag(b, fieldWriteSync, protowire.VarintType)
			b = protowire.AppendVarint(b, s)
		}
		b = protowire.AppendTag(b, fieldWriteCRC, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, w.crc)
	}
	*bp = b
	return &encodedRequest{data: mem.BufferSlice{mem.NewBuffer(bp, pool)}}
}

package client

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/filewrite/filewrite/internal/bufpool"
)

// The sender encodes each WriteStreamRequest itself, straight from the
// queued writes into a pooled buffer, instead of building a message of
// StreamWrites for the proto codec: no message per write to allocate, and
// the callers' bytes are read once, while their callers still wait (see
// fileStream.giveUp). streamCodec passes such a message to gRPC as it is;
// everything else goes through the proto codec.

// Field numbers of WriteStreamRequest, StreamWrite, WriteStreamResponse
// and StreamAck (filewrite.proto).
const (
	fieldAcks        = 1 // WriteStreamResponse.acks
	fieldAckID       = 1 // StreamAck.id
	fieldAckWritten  = 2
	fieldAckSize     = 3
	fieldAckStatus   = 4
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

func (c streamCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*ackResponse); ok {
		return r.decode(data)
	}
	return c.CodecV2.Unmarshal(data, v)
}

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
	pool := bufpool.Shared
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

// ackResponse is a WriteStreamResponse as the receiver reads it, decoded
// by streamCodec into a slice it reuses from message to message.
type ackResponse struct{ acks []ack }

type ack struct {
	id            uint64
	written, size int64
	err           error // from the ack's status; nil when it has none
}

func (r *ackResponse) decode(data mem.BufferSlice) error {
	r.acks = r.acks[:0]
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return errMalformedAcks
		}
		b = b[l:]
		if num != fieldAcks || typ != protowire.BytesType {
			if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
				return errMalformedAcks
			}
			b = b[l:]
			continue
		}
		v, l := protowire.ConsumeBytes(b)
		if l < 0 {
			return errMalformedAcks
		}
		b = b[l:]
		a, err := decodeAck(v)
		if err != nil {
			return err
		}
		r.acks = append(r.acks, a)
	}
	return nil
}

var errMalformedAcks = status.Error(codes.Internal, "filewrite client: a WriteStream response that does not decode")

func decodeAck(b []byte) (ack, error) {
	var a ack
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return a, errMalformedAcks
		}
		b = b[l:]
		var v uint64
		switch {
		case num == fieldAckID && typ == protowire.VarintType:
			a.id, l = protowire.ConsumeVarint(b)
		case num == fieldAckWritten && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			a.written = int64(v)
		case num == fieldAckSize && typ == protowire.VarintType:
			v, l = protowire.ConsumeVarint(b)
			a.size = int64(v)
		case num == fieldAckStatus && typ == protowire.BytesType:
			var raw []byte
			raw, l = protowire.ConsumeBytes(b)
			if l >= 0 {
				st := &spb.Status{}
				if err := proto.Unmarshal(raw, st); err != nil {
					return a, errMalformedAcks
				}
				a.err = status.ErrorProto(st)
			}
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return a, errMalformedAcks
		}
		b = b[l:]
	}
	return a, nil
}

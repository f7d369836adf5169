package service

import (
	"errors"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
)

// The stream's messages skip the generic protobuf code both ways. A
// WriteStreamRequest is decoded by requestCodec straight from the bytes
// gRPC received into a streamRequest: one slab of streamWrites per
// message, whose data alias those bytes instead of copying them; the
// bytes go back to gRPC's pool once every write of the message has been
// applied. Acks are encoded straight from the acked writes into a pooled
// buffer (encodeAcks). Both follow filewrite.proto's field numbers, and
// tests hold them to the generated code.

// Field numbers (filewrite.proto).
const (
	fieldRequestPath   = 1 // WriteStreamRequest.path
	fieldRequestWrites = 2 // WriteStreamRequest.writes
	fieldRequestOpen   = 3 // WriteStreamRequest.open_mode
	fieldWriteID       = 1 // StreamWrite.id
	fieldWriteOffset   = 2
	fieldWriteData     = 3
	fieldWriteSync     = 4
	fieldWriteCRC      = 5
	fieldResponseAcks  = 1 // WriteStreamResponse.acks
	fieldAckID         = 1 // StreamAck.id
	fieldAckWritten    = 2
	fieldAckSize       = 3
	fieldAckStatus     = 4
)

// streamRequest is one WriteStreamRequest as the stream's reader gets it.
type streamRequest struct {
	path   string
	writes []streamWrite
	// openMode is the raw open_mode, read in the first message only.
	openMode filewritev1.OpenMode
	// size is the message's size on the wire.
	size int
	// bad says why the message did not decode; "" if it did. Like
	// requestCodec, decoding never fails gRPC's receive: the reader
	// answers INVALID_ARGUMENT.
	bad string
	// buf holds the received bytes that the writes' data alias; pending
	// counts the writes not yet applied, the last of which frees buf.
	buf     mem.Buffer
	pending atomic.Int32
}

// GetPath is the path the message names, "" if none: spelled like the
// generated getter so that the stream's log line (logStream) finds it.
func (r *streamRequest) GetPath() string { return r.path }

// applied is called once per write of r, when its data is no longer
// needed (applied, refused or dropped).
func (r *streamRequest) applied() {
	if r.pending.Add(-1) == 0 && r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
}

// release gives r's bytes back at once: none of its writes will be
// applied.
func (r *streamRequest) release() {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
}

var errTruncated = errors.New("truncated or malformed wire data")

// decodeStreamRequest decodes data into r, keeping a reference to the
// bytes its writes alias. Fields it does not know are skipped, as the
// generated code keeps them as unknown fields, and so is a known field
// sent with another wire type.
func decodeStreamRequest(data mem.BufferSlice, r *streamRequest) {
	r.size = data.Len()
	if len(data) == 1 {
		data[0].Ref()
		r.buf = data[0]
	} else {
		r.buf = data.MaterializeToBuffer(bufpool.Shared)
	}
	b := r.buf.ReadOnlyData()
	n, err := countWrites(b)
	if err == nil {
		r.writes = make([]streamWrite, 0, n)
		err = r.decode(b)
	}
	if err != nil {
		r.bad = err.Error()
		r.writes = nil
		r.release()
	}
	r.pending.Store(int32(len(r.writes)))
	if len(r.writes) == 0 {
		r.release()
	}
}

// countWrites counts the writes of a message, so that their slab is
// allocated once.
func countWrites(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return 0, errTruncated
		}
		b = b[l:]
		if num == fieldRequestWrites && typ == protowire.BytesType {
			n++
		}
		if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
			return 0, errTruncated
		}
		b = b[l:]
	}
	return n, nil
}

func (r *streamRequest) decode(b []byte) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return errTruncated
		}
		b = b[l:]
		switch {
		case num == fieldRequestPath && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return errTruncated
			}
			if !utf8.Valid(v) {
				return errors.New("path: invalid UTF-8")
			}
			r.path = string(v)
			b = b[l:]
		case num == fieldRequestWrites && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return errTruncated
			}
			r.writes = append(r.writes, streamWrite{req: r})
			if err := r.writes[len(r.writes)-1].decode(v); err != nil {
				return err
			}
			b = b[l:]
		case num == fieldRequestOpen && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return errTruncated
			}
			r.openMode = filewritev1.OpenMode(int32(v))
			b = b[l:]
		default:
			if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
				return errTruncated
			}
			b = b[l:]
		}
	}
	return nil
}

func (w *streamWrite) decode(b []byte) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return errTruncated
		}
		b = b[l:]
		switch {
		case num == fieldWriteID && typ == protowire.VarintType:
			w.id, l = protowire.ConsumeVarint(b)
		case num == fieldWriteOffset && typ == protowire.VarintType:
			var v uint64
			v, l = protowire.ConsumeVarint(b)
			w.off = int64(v)
		case num == fieldWriteData && typ == protowire.BytesType:
			w.data, l = protowire.ConsumeBytes(b)
		case num == fieldWriteSync && typ == protowire.VarintType:
			var v uint64
			v, l = protowire.ConsumeVarint(b)
			w.syncRaw = filewritev1.SyncMode(int32(v))
		case num == fieldWriteCRC && typ == protowire.Fixed32Type:
			w.crc, l = protowire.ConsumeFixed32(b)
			w.hasCRC = true
		default:
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return errTruncated
		}
		b = b[l:]
	}
	return nil
}

// encodedMessage is a message in wire form: requestCodec hands its bytes
// to gRPC as they are.
type encodedMessage struct{ data mem.BufferSlice }

// ackSize is the size of w's StreamAck, without its own tag and length.
func ackSize(w *streamWrite, status []byte) int {
	n := 0
	if w.id != 0 {
		n += protowire.SizeTag(fieldAckID) + protowire.SizeVarint(w.id)
	}
	if v := uint64(w.res.BytesWritten); v != 0 {
		n += protowire.SizeTag(fieldAckWritten) + protowire.SizeVarint(v)
	}
	if v := uint64(w.res.Size); v != 0 {
		n += protowire.SizeTag(fieldAckSize) + protowire.SizeVarint(v)
	}
	if status != nil {
		n += protowire.SizeTag(fieldAckStatus) + protowire.SizeBytes(len(status))
	}
	return n
}

// encodeAcks encodes the WriteStreamResponse that acks ws into m, in a
// buffer of gRPC's pool that gRPC frees once it has sent it.
func encodeAcks(ws []*streamWrite, m *encodedMessage) {
	size := 0
	for _, w := range ws {
		w.status = nil
		if w.err != nil {
			// Rare: the generated code marshals the google.rpc.Status.
			w.status, _ = proto.Marshal(ackStatus(w.err))
		}
		size += protowire.SizeTag(fieldResponseAcks) + protowire.SizeBytes(ackSize(w, w.status))
	}
	pool := bufpool.Shared
	bp := pool.Get(size)
	b := (*bp)[:0]
	for _, w := range ws {
		b = protowire.AppendTag(b, fieldResponseAcks, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(ackSize(w, w.status)))
		if w.id != 0 {
			b = protowire.AppendTag(b, fieldAckID, protowire.VarintType)
			b = protowire.AppendVarint(b, w.id)
		}
		if v := uint64(w.res.BytesWritten); v != 0 {
			b = protowire.AppendTag(b, fieldAckWritten, protowire.VarintType)
			b = protowire.AppendVarint(b, v)
		}
		if v := uint64(w.res.Size); v != 0 {
			b = protowire.AppendTag(b, fieldAckSize, protowire.VarintType)
			b = protowire.AppendVarint(b, v)
		}
		if w.status != nil {
			b = protowire.AppendTag(b, fieldAckStatus, protowire.BytesType)
			b = protowire.AppendBytes(b, w.status)
		}
	}
	*bp = b
	// A new slice each time: gRPC's transport keeps the one it is given
	// until it has written the frame, after SendMsg returns.
	m.data = mem.BufferSlice{mem.NewBuffer(bp, pool)}
}

package client

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/filewrite/filewrite/internal/bufpool"
	"github.com/filewrite/filewrite/internal/streamwire"
)

// The sender encodes each WriteStreamRequest itself, straight from the
// queued writes into a pooled buffer, instead of building a message of
// StreamWrites for the proto codec: no message per write to allocate, and
// the callers' bytes are read once, while their callers still wait (see
// fileStream.giveUp). streamCodec passes such a message to gRPC as it is;
// everything else goes through the proto codec. The wire form itself is
// internal/streamwire's, shared with the daemon.

// encodedRequest is a WriteStreamRequest in wire form.
type encodedRequest struct{ data mem.BufferSlice }

type streamCodec struct{ encoding.CodecV2 }

func newStreamCodec() streamCodec { return streamCodec{encoding.GetCodecV2(protocodec.Name)} }

func (c streamCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch r := v.(type) {
	case *ackResponse:
		return r.decode(data)
	case *readReply:
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

// encodeWrites encodes a WriteStreamRequest (no path) carrying ws to file
// (0: the stream's path), with ids from firstID on, into a buffer of the
// pool. The data of a write that owns its buffer (a Writer's, sent) is
// not copied: the message holds that buffer between the bytes before and
// after it, which are split out of one buffer of the pool.
func encodeWrites(ws []*write, file uint32, firstID uint64) *encodedRequest {
	size := 0
	for i, w := range ws {
		v := w.wire(file, firstID+uint64(i))
		size += streamwire.RequestWriteSize(&v)
		if w.buf.shareable() {
			size -= len(w.data)
		}
	}
	pool := bufpool.Shared
	bp := pool.Get(size)
	b := (*bp)[:0]
	var cuts []int // where each shared write's data goes, in b
	for i, w := range ws {
		v := w.wire(file, firstID+uint64(i))
		if !w.buf.shareable() {
			b = streamwire.AppendWrite(b, &v)
			continue
		}
		b = streamwire.AppendWriteHead(b, &v)
		cuts = append(cuts, len(b))
		b = streamwire.AppendWriteTail(b, &v)
	}
	*bp = b
	rest := mem.NewBuffer(bp, pool)
	if len(cuts) == 0 {
		return &encodedRequest{data: mem.BufferSlice{rest}}
	}
	data := make(mem.BufferSlice, 0, 2*len(cuts)+1)
	at := 0 // where rest begins in b
	for _, w := range ws {
		if !w.buf.shareable() {
			continue
		}
		var head mem.Buffer
		head, rest = mem.SplitUnsafe(rest, cuts[0]-at)
		at, cuts = cuts[0], cuts[1:]
		data = append(data, head, w.buf.hold())
	}
	if rest.Len() == 0 {
		rest.Free()
	} else {
		data = append(data, rest)
	}
	return &encodedRequest{data: data}
}

// ackResponse is a WriteStreamResponse as the receiver reads it, decoded
// by streamCodec into a slice it reuses from message to message.
type ackResponse struct {
	acks  []ack
	files []fileAnswer // of declared files (mux.go)
}

// fileAnswer is the daemon's answer to a file declared on a shared
// stream: err is nil if it is open.
type fileAnswer struct {
	index uint32
	err   error
	gen   int64 // the file's generation when it was opened
}

type ack struct {
	id            uint64
	written, size int64
	offset        int64 // where the write's data begins (an append's, where it landed)
	gen           int64 // the generation a synced write left; 0 in other acks
	err           error // from the ack's status; nil when it has none
}

func (r *ackResponse) decode(data mem.BufferSlice) error {
	r.acks = r.acks[:0]
	r.files = r.files[:0]
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	err := streamwire.EachAck(b, func(a *streamwire.Ack) error {
		carried, err := decodeStatus(a.Status)
		if err != nil {
			return err
		}
		r.acks = append(r.acks, ack{id: a.ID, written: a.Written, size: a.Size, offset: a.Offset, gen: a.Generation, err: carried})
		return nil
	})
	if err != nil {
		return errMalformedAcks
	}
	err = streamwire.EachFileStatus(b, func(f *streamwire.FileStatus) error {
		carried, err := decodeStatus(f.Status)
		if err != nil {
			return err
		}
		r.files = append(r.files, fileAnswer{index: f.Index, err: wrapErr(carried), gen: f.Generation})
		return nil
	})
	if err != nil {
		return errMalformedAcks
	}
	return nil
}

// decodeStatus returns the error that raw, a google.rpc.Status in wire
// form of an ack or a file's answer, carries: nil when raw is nil (none)
// or OK. err is errMalformedAcks if raw does not decode.
func decodeStatus(raw []byte) (carried, err error) {
	if raw == nil {
		return nil, nil
	}
	st := &spb.Status{}
	if proto.Unmarshal(raw, st) != nil {
		return nil, errMalformedAcks
	}
	return status.ErrorProto(st), nil
}

var errMalformedAcks = status.Error(codes.Internal, "filewrite client: a WriteStream response that does not decode")

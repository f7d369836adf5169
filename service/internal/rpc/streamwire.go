package rpc

import (
	"sync/atomic"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/streamengine"
	"github.com/filewrite/filewrite/store"
)

// The stream's messages skip the generic protobuf code both ways. A
// WriteStreamRequest is decoded by requestCodec straight from the bytes
// gRPC received into a streamRequest, in two steps. The codec only scans
// the message (streamwire.ScanRequest): it counts the writes and their
// bytes, refuses more than streamwire.MaxWritesPerMessage, and allocates
// nothing per write. Only once the reader has checked the message's size
// and taken its cost from the budgets, which count a record per write
// (admit.StreamWriteOverhead), does decodeWrites build one slab of streamWrites
// for it, whose data alias the received bytes instead of copying them;
// the bytes go back to gRPC's pool once every write of the message has
// been applied. Acks are encoded straight from the acked writes into a pooled
// buffer (encodeAcks). The wire form is internal/streamwire's, shared with
// the client.

// streamRequest is one WriteStreamRequest as the stream's reader gets it.
type streamRequest struct {
	// msg is the message as scanned (its path and open_mode among the
	// rest); writes is empty until decodeWrites.
	msg    streamwire.Request
	writes []streamWrite
	// size is the message's size on the wire.
	size int
	// err is why the message did not decode (ScanRequest's error), nil
	// if it did. Like requestCodec, decoding never fails gRPC's receive:
	// the reader answers INVALID_ARGUMENT (check).
	err error
	// buf holds the received bytes that the writes' data alias; pending
	// counts the writes not yet applied, the last of which frees buf.
	buf     mem.Buffer
	pending atomic.Int32
}

// GetPath is the path the message names, "" if none: spelled like the
// generated getter so that the stream's log line (logStream) finds it.
func (r *streamRequest) GetPath() string { return r.msg.Path }

// Applied is called once per write of r, when its data is no longer
// needed (applied, refused or dropped).
func (r *streamRequest) Applied() {
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

// decodeStreamRequest scans data into r, keeping a reference to the bytes
// its writes will alias.
func decodeStreamRequest(data mem.BufferSlice, r *streamRequest) {
	r.size = data.Len()
	if len(data) == 1 {
		data[0].Ref()
		r.buf = data[0]
	} else {
		r.buf = data.MaterializeToBuffer(bufpool.Shared)
	}
	msg, err := streamwire.ScanRequest(r.buf.ReadOnlyData(), streamwire.MaxWritesPerMessage)
	if err != nil {
		r.err = err
		r.release()
		return
	}
	r.msg = msg
	if msg.Writes == 0 {
		r.release()
	}
}

// cost is what r's writes count against the budgets: the sum of their
// admit.WriteCost.
func (r *streamRequest) cost() int64 {
	return r.msg.DataBytes + int64(r.msg.Writes)*admit.StreamWriteOverhead
}

// decodeWrites builds r's writes, once their cost has been taken.
func (r *streamRequest) decodeWrites() {
	r.writes = make([]streamWrite, r.msg.Writes)
	r.msg.Each(func(i int, w *streamwire.Write) {
		r.writes[i] = streamWrite{
			Write:   streamengine.Write{ID: w.ID, Off: w.Offset, Data: w.Data, Append: w.Append, AppendID: w.AppendID, FileIndex: w.File, Msg: r},
			syncRaw: filewritev1.SyncMode(w.Sync), crc: w.CRC, hasCRC: w.HasCRC}
	})
	r.pending.Store(int32(len(r.writes)))
}

// encodedMessage is a message in wire form: requestCodec hands its bytes
// to gRPC as they are.
type encodedMessage struct{ data mem.BufferSlice }

// encodeAcks encodes the WriteStreamResponse that reports files and acks
// ws into m, in a buffer of gRPC's pool that gRPC frees once it has sent
// it.
func encodeAcks(ws []*streamengine.Write, files []streamengine.FileStatus, m *encodedMessage) {
	size := 0
	var statuses []streamwire.FileStatus
	if len(files) > 0 {
		statuses = make([]streamwire.FileStatus, len(files))
		for i, f := range files {
			statuses[i].Index, statuses[i].Generation = f.Index, f.Generation
			if f.Err != nil {
				statuses[i].Status, _ = proto.Marshal(ackStatus(f.Err))
			}
			size += streamwire.ResponseFileStatusSize(&statuses[i])
		}
	}
	// failed holds the acks' statuses, by index, once one of them failed.
	var failed [][]byte
	for i, w := range ws {
		if w.Err != nil {
			// Rare: the generated code marshals the google.rpc.Status.
			if failed == nil {
				failed = make([][]byte, len(ws))
			}
			failed[i], _ = proto.Marshal(ackStatus(w.Err))
		}
		a := ackOf(w, failed, i)
		size += streamwire.ResponseAckSize(&a)
	}
	pool := bufpool.Shared
	bp := pool.Get(size)
	b := (*bp)[:0]
	for i := range statuses {
		b = streamwire.AppendFileStatus(b, &statuses[i])
	}
	for i, w := range ws {
		a := ackOf(w, failed, i)
		b = streamwire.AppendAck(b, &a)
	}
	*bp = b
	// A new slice each time: gRPC's transport keeps the one it is given
	// until it has written the frame, after SendMsg returns.
	m.data = mem.BufferSlice{mem.NewBuffer(bp, pool)}
}

// ackOf is w's StreamAck, the i-th of a response whose failed acks'
// statuses are in failed (nil: none failed). A synced write's carries the
// generation it left: where the sync was paid for, a few bytes more
// cost nothing, and a writer learns the version its durable write made.
func ackOf(w *streamengine.Write, failed [][]byte, i int) streamwire.Ack {
	a := streamwire.Ack{ID: w.ID, Written: int64(w.Res.BytesWritten), Size: w.Res.Size, Offset: w.Landed}
	if failed != nil {
		a.Status = failed[i]
	}
	if w.Err == nil && w.Sync != store.SyncNone {
		a.Generation = w.Res.Generation
	}
	return a
}

// streamWrite is one write as the reader decodes it: what the engine
// schedules, and what only the reader checks before it hands the write
// out (accept).
type streamWrite struct {
	streamengine.Write
	syncRaw filewritev1.SyncMode
	crc     uint32
	hasCRC  bool
}

package admit

import (
	"context"
	"unsafe"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/bufpool"
)

// A Read's reply without copies. The handler reads the file straight into
// a pooled buffer (ReplyBuffer), and the reply's encoding sends that
// buffer as it is, behind a few bytes of header, giving it back to the
// pool (and the reply's share back to the budget) once grpc-go has
// written it: no buffer allocated and zeroed per call, no copy from the
// reply's data into its encoding. A bulk download (the client's Reader)
// spent half of the daemon's CPU on those.

// replyShare is what a Read's reply holds between its handler and its
// encoding: its share of the budget, and the pooled buffer its data lies
// in (nil if none).
type replyShare struct {
	owed int64
	data *[]byte
}

// ReplyBuffer returns a slice of n bytes for a Read's data to be read
// into, in a pooled buffer that the reply's encoding sends without a copy
// and gives back once it is written. ctx is the Read's: outside a call
// that GRPCBudget tags (the doors' direct road) it is an ordinary slice.
// A handler asks for one buffer at most; if it fails, the buffer goes
// back to the pool.
func ReplyBuffer(ctx context.Context, n int) []byte {
	cb, _ := ctx.Value(callBudgetKey{}).(*callBudget)
	if cb == nil || cb.stream || cb.data != nil {
		return make([]byte, n)
	}
	cb.data = bufpool.Shared.Get(n)
	return *cb.data
}

// holds reports whether data is the start of buf.
func holds(buf *[]byte, data []byte) bool {
	return len(data) > 0 && len(data) <= len(*buf) && unsafe.SliceData(data) == unsafe.SliceData(*buf)
}

// replyCodec is the public server's codec: requestCodec, whose Marshal
// encodes a Read's reply around its pooled data, and gives that buffer its
// share of the budget to hand back when grpc-go frees it, once written.
type replyCodec struct {
	encoding.CodecV2
	g *GRPCBudget
}

// NewReplyCodec is base (the server's requestCodec) with a Read's reply
// handing its share of g's budget back once written.
func NewReplyCodec(base encoding.CodecV2, g *GRPCBudget) encoding.CodecV2 {
	return replyCodec{base, g}
}

func (c replyCodec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*filewritev1.ReadResponse)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	held, ok := c.g.replies.LoadAndDelete(r)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	share := held.(replyShare)
	if share.data != nil && len(r.ProtoReflect().GetUnknown()) == 0 {
		return c.pooledReply(r, share), nil
	}
	buf, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, proto.Size(r)), r)
	if err != nil || mem.IsBelowBufferPoolingThreshold(cap(buf)) {
		// A small buffer is never handed back (mem.NewBuffer).
		c.g.budget.Release(share.owed)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	return mem.BufferSlice{mem.NewBuffer(&buf, &owedBytes{budget: c.g.budget, n: share.owed})}, nil
}

// pooledReply encodes r, whose data lies at the start of share.data: its
// crc32c field and the data field's tag and length in a small header,
// then the pooled buffer itself. Protobuf lets fields come in any order;
// every decoder takes them so.
func (c replyCodec) pooledReply(r *filewritev1.ReadResponse, share replyShare) mem.BufferSlice {
	var hdr []byte
	if r.Crc32C != nil {
		hdr = protowire.AppendTag(hdr, 2, protowire.Fixed32Type)
		hdr = protowire.AppendFixed32(hdr, r.GetCrc32C())
	}
	hdr = protowire.AppendTag(hdr, 1, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(r.GetData())))
	*share.data = (*share.data)[:len(r.GetData())]
	if mem.IsBelowBufferPoolingThreshold(len(*share.data)) {
		// Never handed back (mem.NewBuffer): copied into the header's
		// buffer, and given back now.
		out := append(hdr, *share.data...)
		bufpool.Shared.Put(share.data)
		c.g.budget.Release(share.owed)
		return mem.BufferSlice{mem.SliceBuffer(out)}
	}
	return mem.BufferSlice{mem.SliceBuffer(hdr), mem.NewBuffer(share.data, &owedBytes{budget: c.g.budget, n: share.owed, pooled: true})}
}

// owedBytes is the "pool" of one reply's buffer: grpc-go puts the buffer
// back once, when it no longer needs it, and the reply's share of the
// budget goes back with it; a pooled buffer goes back to bufpool.
type owedBytes struct {
	budget *Budget
	n      int64
	pooled bool
}

func (o *owedBytes) Get(n int) *[]byte { b := make([]byte, n); return &b } // unused by grpc-go
func (o *owedBytes) Put(b *[]byte) {
	o.budget.Release(o.n)
	if o.pooled {
		bufpool.Shared.Put(b)
	}
}

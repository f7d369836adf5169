package client

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// A Read's reply is decoded by streamCodec too, into readReply: its data
// is copied once, from the buffers gRPC received it into straight into
// the caller's slice (or a Reader's pooled piece), its CRC-32C computed
// on the way while the bytes are in the cache. The proto codec would join
// the buffers into one, copy the data out of it into a new slice, and
// leave both to the collector: for a bulk download (Reader, io.Copy) that
// was most of the client's CPU.

// readReply is a ReadResponse as readPiece decodes it.
type readReply struct {
	// dst is where the data goes; data longer than dst is refused
	// (tooLong), not copied.
	dst []byte
	// n is the data's length, sum its CRC-32C as received.
	n   int
	sum uint32
	// crc is the CRC-32C the daemon sent, if hasCRC.
	crc    uint32
	hasCRC bool
	// tooLong is the length of data that did not fit in dst, 0 if none.
	tooLong int
}

// readChunk is how much data decode copies before it adds it to the
// CRC-32C: small enough to be in the cache still.
const readChunk = 64 << 10

var errMalformedRead = status.Error(codes.Internal, "filewrite client: a Read response that does not decode")

func (r *readReply) decode(data mem.BufferSlice) error {
	rd := data.Reader()
	defer rd.Close()
	for rd.Remaining() > 0 {
		tag, err := binary.ReadUvarint(rd)
		if err != nil {
			return errMalformedRead
		}
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		switch {
		case num == 1 && typ == protowire.BytesType:
			err = r.decodeData(rd)
		case num == 2 && typ == protowire.Fixed32Type:
			var b [4]byte
			if _, err = io.ReadFull(rd, b[:]); err == nil {
				r.crc, r.hasCRC = binary.LittleEndian.Uint32(b[:]), true
			}
		default:
			err = skipField(rd, typ)
		}
		if err != nil {
			return errMalformedRead
		}
	}
	return nil
}

// decodeData copies the data field's bytes from rd into dst.
func (r *readReply) decodeData(rd *mem.Reader) error {
	l, err := binary.ReadUvarint(rd)
	if err != nil || l > uint64(rd.Remaining()) {
		return errMalformedRead
	}
	n := int(l)
	r.n, r.sum, r.tooLong = 0, 0, 0 // a repeated field: the last wins
	if n > len(r.dst) {
		r.tooLong = n
		_, err := rd.Discard(n)
		return err
	}
	for r.n < n {
		k, _ := rd.Read(r.dst[r.n:min(n, r.n+readChunk)])
		if k == 0 {
			return errMalformedRead
		}
		r.sum = crc32.Update(r.sum, castagnoli, r.dst[r.n:r.n+k])
		r.n += k
	}
	return nil
}

// skipField reads past a field of type typ whose tag was read: an unknown
// field, which a newer daemon may send.
func skipField(rd *mem.Reader, typ protowire.Type) error {
	var n uint64
	switch typ {
	case protowire.VarintType:
		_, err := binary.ReadUvarint(rd)
		return err
	case protowire.Fixed32Type:
		n = 4
	case protowire.Fixed64Type:
		n = 8
	case protowire.BytesType:
		l, err := binary.ReadUvarint(rd)
		if err != nil {
			return err
		}
		n = l
	default:
		return errors.New("unsupported wire type")
	}
	if n > uint64(rd.Remaining()) {
		return io.ErrUnexpectedEOF
	}
	_, err := rd.Discard(int(n))
	return err
}

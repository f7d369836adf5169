package rpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/filewrite/filewrite/service/internal/status"
)

// A request that does not decode (malformed wire data, a string field that
// is not UTF-8) is the caller's mistake: INVALID_ARGUMENT. grpc-go reports
// any error of its codec's Unmarshal as INTERNAL, a fault of the server,
// before an interceptor runs, and has no option to change that. So the
// server's codec never fails to unmarshal a message: it leaves it empty but
// for a marker in its unknown fields that carries the error (undecodable),
// and the interceptors below answer INVALID_ARGUMENT when they meet one.
// They run after the call was admitted (authenticated), so a stranger
// learns nothing of how a request is parsed.
//
// requestCodec is grpc's protobuf codec with the Unmarshal described above.
type requestCodec struct{ encoding.CodecV2 }

func NewRequestCodec() requestCodec {
	return requestCodec{encoding.GetCodecV2(protocodec.Name)}
}

// Marshal passes a message already in wire form (a WriteStream's acks,
// streamwire.go) as it is.
func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*encodedMessage); ok {
		return m.data, nil
	}
	return c.CodecV2.Marshal(v)
}

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*streamRequest); ok {
		decodeStreamRequest(data, r)
		return nil
	}
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	status.MarkUndecodable(m, err)
	return nil
}

// RejectUndecodableUnary answers a unary call whose request did not decode.
func RejectUndecodableUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if msg, bad := status.Undecodable(req); bad {
		return nil, status.Malformed(msg)
	}
	return handler(ctx, req)
}

// RejectUndecodableStream ends a stream at the first message that did not
// decode.
func RejectUndecodableStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, decodedStream{ss})
}

type decodedStream struct{ grpc.ServerStream }

func (s decodedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if msg, bad := status.Undecodable(m); bad {
		return status.Malformed(msg)
	}
	return nil
}

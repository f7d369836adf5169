package service

import (
	"bytes"
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
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
// The marker is a field numbered 0, which is outside the numbers a field
// may have: the decoder refuses it, so no message it decoded holds one,
// and no field a client sends (any number, 536870911 included) is taken
// for it. It carries the decoder's own error, which names no byte of the
// message.

// undecodableTag starts the marker: field 0, length-delimited.
var undecodableTag = protowire.AppendTag(nil, 0, protowire.BytesType)

// requestCodec is grpc's protobuf codec with the Unmarshal described above.
type requestCodec struct{ encoding.CodecV2 }

func newRequestCodec() requestCodec {
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
	proto.Reset(m) // what a failed Unmarshal left is no request
	m.ProtoReflect().SetUnknown(protowire.AppendString(bytes.Clone(undecodableTag), err.Error()))
	return nil
}

// undecodable returns the decoding error that requestCodec left in m, or "".
func undecodable(m any) (string, bool) {
	pm, ok := m.(proto.Message)
	if !ok {
		return "", false
	}
	b, ok := bytes.CutPrefix(pm.ProtoReflect().GetUnknown(), undecodableTag)
	if !ok {
		return "", false
	}
	s, n := protowire.ConsumeString(b)
	return s, n >= 0
}

func malformed(msg string) error {
	return refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "malformed request: %s", msg)
}

// rejectUndecodableUnary answers a unary call whose request did not decode.
func rejectUndecodableUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if msg, bad := undecodable(req); bad {
		return nil, malformed(msg)
	}
	return handler(ctx, req)
}

// rejectUndecodableStream ends a stream at the first message that did not
// decode.
func rejectUndecodableStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, decodedStream{ss})
}

type decodedStream struct{ grpc.ServerStream }

func (s decodedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if msg, bad := undecodable(m); bad {
		return malformed(msg)
	}
	return nil
}

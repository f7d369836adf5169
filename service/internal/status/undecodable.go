package status

import (
	"bytes"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// A request that does not decode is left empty by the server's codec but
// for a marker in its unknown fields that carries the decoder's error, and
// the interceptors answer INVALID_ARGUMENT when they meet one (the codec,
// in service/internal/rpc, says why).
//
// The marker is a field numbered 0, which is outside the numbers a field
// may have: the decoder refuses it, so no message it decoded holds one,
// and no field a client sends (any number, 536870911 included) is taken
// for it. It carries the decoder's own error, which names no byte of the
// message.

// undecodableTag starts the marker: field 0, length-delimited.
var undecodableTag = protowire.AppendTag(nil, 0, protowire.BytesType)

// MarkUndecodable leaves m empty but for the marker that carries err, the
// decoder's error.
func MarkUndecodable(m proto.Message, err error) {
	proto.Reset(m) // what a failed Unmarshal left is no request
	m.ProtoReflect().SetUnknown(protowire.AppendString(bytes.Clone(undecodableTag), err.Error()))
}

// Undecodable returns the decoding error that MarkUndecodable left in m, or "".
func Undecodable(m any) (string, bool) {
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

// Malformed is the refusal of a request that did not decode.
func Malformed(msg string) error {
	return Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "malformed request: %s", msg)
}

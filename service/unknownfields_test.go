package service

import (
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// laterFields are the fields a newer client adds to every request
// message; this daemon knows none of them. 536870911 is the largest field
// number there is.
var laterFields = []struct {
	num   int32
	typ   descriptorpb.FieldDescriptorProto_Type
	value protoreflect.Value
}{
	{536870911, descriptorpb.FieldDescriptorProto_TYPE_STRING, protoreflect.ValueOfString("later")},
	{536870910, descriptorpb.FieldDescriptorProto_TYPE_BYTES, protoreflect.ValueOfBytes([]byte("\x00\xff later"))},
	{1000, descriptorpb.FieldDescriptorProto_TYPE_UINT64, protoreflect.ValueOfUint64(1 << 60)},
	{1001, descriptorpb.FieldDescriptorProto_TYPE_FIXED32, protoreflect.ValueOfUint32(7)},
}

// laterProto is filewrite.proto as a newer client sees it: a copy with
// laterFields added to every request message, StreamWrite included.
func laterProto(t *testing.T) protoreflect.FileDescriptor {
	fdp := protodesc.ToFileDescriptorProto(filewritev1.File_filewrite_v1_filewrite_proto)
	for _, m := range fdp.MessageType {
		if !strings.HasSuffix(m.GetName(), "Request") && m.GetName() != "StreamWrite" {
			continue
		}
		for _, f := range laterFields {
			m.Field = append(m.Field, &descriptorpb.FieldDescriptorProto{
				Name:     proto.String("later_" + f.typ.String() + "_" + m.GetName()),
				JsonName: proto.String("later" + f.typ.String()),
				Number:   proto.Int32(f.num),
				Label:    descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type:     f.typ.Enum(),
			})
		}
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// later turns m, a request of the generated code, into the newer client's
// message of the same name, with every laterField set, in nested
// request messages too.
func later(t *testing.T, fd protoreflect.FileDescriptor, m proto.Message) *dynamicpb.Message {
	wire, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Messages().ByName(m.ProtoReflect().Descriptor().Name())
	dm := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(wire, dm); err != nil {
		t.Fatal(err)
	}
	var set func(protoreflect.Message)
	set = func(pm protoreflect.Message) {
		for _, f := range laterFields {
			pm.Set(pm.Descriptor().Fields().ByNumber(protoreflect.FieldNumber(f.num)), f.value)
		}
		pm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.IsList() && fd.Message() != nil {
				for i := range v.List().Len() {
					set(v.List().Get(i).Message())
				}
			}
			return true
		})
	}
	set(dm)
	return dm
}

// TestUnknownFieldsInEveryRequest: a client built from a newer proto,
// which adds fields this daemon does not know to every request message
// (the largest field number, 536870911, among them), is served as if it
// had not sent them, as proto3 asks; its replies decode with the
// generated code. Every RPC of the service is called.
func TestUnknownFieldsInEveryRequest(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	fd := laterProto(t)
	const svc = "/filewrite.v1.FileService/"
	// In order: each call leaves the file as the next expects it.
	calls := []struct {
		method string
		req    proto.Message
		resp   proto.Message
	}{
		{"Write", &filewritev1.WriteRequest{Path: "u/f.bin", Data: []byte("hello, world")}, &filewritev1.WriteResponse{}},
		{"Append", &filewritev1.AppendRequest{Path: "u/f.bin", Data: []byte("!"), AppendId: "u1"}, &filewritev1.AppendResponse{}},
		{"Fsync", &filewritev1.FsyncRequest{Path: "u/f.bin"}, &filewritev1.FsyncResponse{}},
		{"Truncate", &filewritev1.TruncateRequest{Path: "u/f.bin", Size: 5}, &filewritev1.TruncateResponse{}},
		{"Fallocate", &filewritev1.FallocateRequest{Path: "u/f.bin", Mode: filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE, Length: 4096}, &filewritev1.FallocateResponse{}},
		{"Stat", &filewritev1.StatRequest{Path: "u/f.bin"}, &filewritev1.StatResponse{}},
		{"Read", &filewritev1.ReadRequest{Path: "u/f.bin", Length: 5}, &filewritev1.ReadResponse{}},
		{"Extents", &filewritev1.ExtentsRequest{Path: "u/f.bin", Length: 4096}, &filewritev1.ExtentsResponse{}},
		{"Digest", &filewritev1.DigestRequest{Path: "u/f.bin", Algorithm: "sha-256"}, &filewritev1.DigestResponse{}},
		{"List", &filewritev1.ListRequest{Path: "u"}, &filewritev1.ListResponse{}},
		{"Rename", &filewritev1.RenameRequest{Path: "u/f.bin", NewPath: "u/g.bin"}, &filewritev1.RenameResponse{}},
		{"Delete", &filewritev1.DeleteRequest{Path: "u/g.bin"}, &filewritev1.DeleteResponse{}},
	}
	called := map[string]bool{}
	for _, c := range calls {
		called[c.method] = true
		if err := d.conn.Invoke(ctx, svc+c.method, later(t, fd, c.req), c.resp); err != nil {
			t.Errorf("%s with later fields: %v", c.method, err)
			continue
		}
		if u := c.resp.ProtoReflect().GetUnknown(); len(u) != 0 {
			t.Errorf("%s: the reply has fields the generated code does not know: %x", c.method, u)
		}
	}
	if got := string(calls[6].resp.(*filewritev1.ReadResponse).GetData()); got != "hello" {
		t.Errorf("Read: %q, want %q", got, "hello")
	}

	called["WriteStream"] = true
	stream, err := d.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, svc+"WriteStream")
	if err != nil {
		t.Fatal(err)
	}
	req := &filewritev1.WriteStreamRequest{Path: "u/s.bin", Writes: []*filewritev1.StreamWrite{
		streamWriteOf(1, 0, []byte("abc"), 0), streamWriteOf(2, 3, []byte("def"), 0)}}
	if err := stream.SendMsg(later(t, fd, req)); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	acks := 0
	for {
		resp := &filewritev1.WriteStreamResponse{}
		if err := stream.RecvMsg(resp); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Errorf("WriteStream with later fields: %v", err)
			}
			break
		}
		for _, a := range resp.Acks {
			if a.Status != nil {
				t.Errorf("WriteStream: write %d acked with %v", a.Id, a.Status)
			}
			acks++
		}
	}
	if acks != 2 {
		t.Errorf("WriteStream: %d acks, want 2", acks)
	}

	methods := filewritev1.File_filewrite_v1_filewrite_proto.Services().Get(0).Methods()
	for i := range methods.Len() {
		if m := methods.Get(i); !called[string(m.Name())] {
			t.Errorf("%s is not called with later fields: add it", m.Name())
		}
	}
}

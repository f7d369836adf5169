package service

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/gateway"
)

// wireCodec sends a []byte as the message, byte for byte, so that a test
// can send what no protobuf library would encode.
type wireCodec struct{}

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (wireCodec) Name() string { return "proto" }

// stringField is field 1 (every request's path) holding s, UTF-8 or not.
func stringField(s string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), s)
}

// malformedRequests are requests that do not decode: wire data cut short,
// and a path that is not UTF-8 (proto3 strings must be).
var malformedRequests = []struct {
	name string
	wire []byte
}{
	{"truncated length", []byte{0x0a, 0xff}},
	{"field cut short", []byte{0x0a, 0x05, 'a', 'b'}},
	{"path not UTF-8", stringField("bad\xffname")},
}

// TestMalformedRequests: a request that does not decode is
// INVALID_ARGUMENT, not INTERNAL, on every method, unary or stream, and
// changes nothing.
func TestMalformedRequests(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	methods := []string{
		filewritev1.FileService_Write_FullMethodName,
		filewritev1.FileService_Read_FullMethodName,
		filewritev1.FileService_Stat_FullMethodName,
		filewritev1.FileService_Truncate_FullMethodName,
		filewritev1.FileService_Fallocate_FullMethodName,
		filewritev1.FileService_Fsync_FullMethodName,
		filewritev1.FileService_Extents_FullMethodName,
		"/grpc.health.v1.Health/Check",
	}
	for _, req := range malformedRequests {
		for _, method := range methods {
			t.Run(req.name+method, func(t *testing.T) {
				before := testutil.Snapshot(t, d.dir)
				var resp []byte
				err := d.conn.Invoke(ctx, method, &req.wire, &resp, grpc.ForceCodecV2(wireCodec{}))
				if status.Code(err) != codes.InvalidArgument {
					t.Errorf("%s with %x: %v, want INVALID_ARGUMENT", method, req.wire, err)
				}
				if strings.Contains(status.Convert(err).Message(), "name") {
					t.Errorf("%s with %x: %q echoes the request's bytes", method, req.wire, status.Convert(err).Message())
				}
				testutil.CheckUnchanged(t, d.dir, before)
			})
		}
		t.Run(req.name+"/stream", func(t *testing.T) {
			desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
			stream, err := d.conn.NewStream(ctx, desc, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", grpc.ForceCodecV2(wireCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.SendMsg(&req.wire); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			var resp []byte
			if err := stream.RecvMsg(&resp); status.Code(err) != codes.InvalidArgument {
				t.Errorf("a stream sent %x: %v, want INVALID_ARGUMENT", req.wire, err)
			}
		})
	}
	// The daemon still answers a well-formed request.
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "ok", Data: []byte("x")}); err != nil {
		t.Errorf("a good Write after the malformed ones: %v", err)
	}
}

// TestMalformedRequestsOfStrangers: a caller without a token learns that,
// not how its request was parsed.
func TestMalformedRequestsOfStrangers(t *testing.T) {
	d := startAuthDaemon(t)
	ctx := testContext(t)
	for _, req := range malformedRequests {
		var resp []byte
		err := d.conn.Invoke(ctx, filewritev1.FileService_Write_FullMethodName, &req.wire, &resp, grpc.ForceCodecV2(wireCodec{}))
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a token: %v, want UNAUTHENTICATED", req.name, err)
		}
		err = d.conn.Invoke(withAuth(ctx, "Bearer "+tokenAlpha), filewritev1.FileService_Write_FullMethodName, &req.wire, &resp, grpc.ForceCodecV2(wireCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s with a token: %v, want INVALID_ARGUMENT", req.name, err)
		}
	}
}

// TestInvalidUTF8OverREST: a path or query string that is not UTF-8 cannot
// become a request (proto3 strings must be UTF-8): 400, not 500.
func TestInvalidUTF8OverREST(t *testing.T) {
	d := startDaemon(t, nil)
	octet := map[string]string{"Content-Type": gateway.MIMEOctetStream}
	for _, tt := range []struct {
		method, path string
		header       map[string]string
	}{
		{"GET", "/v1/files/bad%FFname", nil},
		{"GET", "/v1/files/bad%FFname:read?length=1", nil},
		{"PUT", "/v1/files/dir/bad%C3", octet},
		{"POST", "/v1/files/bad%FF:truncate", map[string]string{"Content-Type": "application/json"}},
		{"GET", "/v1/files/ok:extents?pageToken=%FF", nil},
	} {
		before := testutil.Snapshot(t, d.dir)
		r := testutil.DoHTTP(t, tt.method, d.url+tt.path, nil, tt.header)
		if r.Status != http.StatusBadRequest {
			t.Errorf("%s %s: %d %s, want 400", tt.method, tt.path, r.Status, r.Body)
		} else if e := testutil.ParseErrorBody(t, r); e.Code != codes.InvalidArgument {
			t.Errorf("%s %s: %+v, want INVALID_ARGUMENT", tt.method, tt.path, e)
		}
		testutil.CheckUnchanged(t, d.dir, before)
	}
}

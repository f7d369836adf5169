package client_test

import (
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// closingFiles is a FileService whose WriteStream acks the writes of the
// first message after the opening one and then ends the stream with OK,
// reading nothing more, as a daemon that closes streams it deems idle
// would: every write it read is acked, the others were never read.
type closingFiles struct {
	filewritev1.UnimplementedFileServiceServer
	streams atomic.Int64
}

func (s *closingFiles) WriteStream(ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) error {
	s.streams.Add(1)
	if _, err := ss.Recv(); err != nil {
		return nil
	}
	if err := ss.Send(&filewritev1.WriteStreamResponse{}); err != nil {
		return err
	}
	req, err := ss.Recv()
	if err != nil {
		return nil
	}
	resp := &filewritev1.WriteStreamResponse{}
	for _, w := range req.GetWrites() {
		resp.Acks = append(resp.Acks, &filewritev1.StreamAck{Id: w.GetId(), BytesWritten: int64(len(w.GetData()))})
	}
	return ss.Send(resp)
}

// TestStreamEndedCleanly: when the daemon ends a stream with OK, the
// writes it had not read go on a new stream, without WithRetry and
// without the callers noticing.
func TestStreamEndedCleanly(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &closingFiles{}
	srv := grpc.NewServer()
	filewritev1.RegisterFileServiceServer(srv, fake)
	go srv.Serve(lis)
	defer srv.Stop()
	ctx := testContext(t)
	c := dial(t, lis.Addr().String())
	f, err := c.Open(ctx, "idle/f")
	if err != nil {
		t.Fatal(err)
	}
	// One after the other: each goes on a stream that the one before
	// ended, or that is ending, or a new one.
	for i := range 20 {
		if _, err := f.WriteAt([]byte("x"), int64(i)); err != nil {
			t.Errorf("write %d: %v, want nil", i, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if fake.streams.Load() < 20 {
		t.Errorf("%d streams, want one a write at least: each ends after one message", fake.streams.Load())
	}
}

package client_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/service"
)

// closingFiles is a FileService whose WriteStream acks the writes of the
// first message after the opening one and then ends the stream with end
// (nil: OK), reading nothing more, as a daemon that closes a stream for
// being idle does when a message races the close: every write it read is
// acked, the others were never read.
type closingFiles struct {
	filewritev1.UnimplementedFileServiceServer
	end     error
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
	if err := ss.Send(&filewritev1.WriteStreamResponse{Acks: ackedInFull(req)}); err != nil {
		return err
	}
	return s.end
}

// idleEnd is the status a daemon ends an idle stream with.
func idleEnd(t *testing.T) error {
	st, err := status.New(codes.Unavailable, "the stream was idle").WithDetails(&errdetails.ErrorInfo{
		Reason: filewritev1.ErrorReason_STREAM_IDLE.String(), Domain: client.ErrorDomain})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestStreamEndedCleanly: when the daemon ends a stream with OK, or with
// STREAM_IDLE, the writes it had not read go on a new stream, without
// WithRetry and without the callers noticing.
func TestStreamEndedCleanly(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  error
	}{
		{"OK", nil},
		{"STREAM_IDLE", idleEnd(t)},
	} {
		t.Run(tt.name, func(t *testing.T) { testStreamEndedCleanly(t, tt.end) })
	}
}

func testStreamEndedCleanly(t *testing.T, end error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &closingFiles{end: end}
	srv := grpc.NewServer()
	filewritev1.RegisterFileServiceServer(srv, fake)
	go srv.Serve(lis)
	defer srv.Stop()
	ctx := testContext(t)
	c := dial(t, lis.Addr().String(), client.WithSharedStreams(0)) // the fake speaks one file per stream
	f := openFile(t, ctx, c, "idle/f")
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

// TestIdleFilesGiveBackFiles: 64 Files left open and idle against
// --max-open-files 64 hold every file the daemon may open only until
// --stream-idle-timeout closes their streams: another client then opens
// and writes a new file at once, and each of the 64 writes again without
// an error and without WithRetry, on a new stream.
func TestIdleFilesGiveBackFiles(t *testing.T) {
	const files = 64
	d := startDaemon(t, func(c *service.Config) {
		c.Store.MaxOpenFiles = files
		c.StreamIdleTimeout = 100 * time.Millisecond
		c.HTTPAddr = "127.0.0.1:0" // for /metrics
	})
	ctx := testContext(t)
	holder := dial(t, d.addr)
	var open []*client.File
	for i := range files {
		f, err := holder.Open(ctx, fmt.Sprintf("held/%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("a"), 0); err != nil {
			t.Fatal(err)
		}
		open = append(open, f)
	}

	// Every stream closed and its file given back (the gauge goes down
	// once the stream's file is closed).
	for streamsOpen(t, d) > 0 {
		if ctx.Err() != nil {
			t.Fatalf("%v streams still open: idle streams are not closed", streamsOpen(t, d))
		}
		time.Sleep(10 * time.Millisecond)
	}
	other := dial(t, d.addr)
	f, err := other.Open(ctx, "new")
	if err != nil {
		t.Fatalf("Open of a new file once the idle streams are closed: %v", err)
	}
	if _, err := f.WriteAt([]byte("new"), 0); err != nil {
		t.Fatalf("write to a new file: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	for i, f := range open {
		if _, err := f.WriteAt([]byte("b"), 1); err != nil {
			t.Errorf("write to %s after its stream was closed for idleness: %v, want nil", f.Name(), err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("Close of %s: %v", f.Name(), err)
		}
		if got := string(d.onDisk(t, fmt.Sprintf("held/%02d", i))); got != "ab" {
			t.Errorf("%s holds %q, want %q", f.Name(), got, "ab")
		}
	}
}

// streamsOpen reads the daemon's filewrite_streams_open gauge.
func streamsOpen(t *testing.T, d *daemon) float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.srv.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "filewrite_streams_open "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("filewrite_streams_open %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("/metrics has no filewrite_streams_open (%v)", sc.Err())
	return 0
}

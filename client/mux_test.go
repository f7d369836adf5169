package client_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
)

// streamCounter counts the WriteStreams a connection opens.
type streamCounter struct{ n atomic.Int64 }

func (sc *streamCounter) interceptor(ctx context.Context, desc *grpc.StreamDesc, conn *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	sc.n.Add(1)
	return streamer(ctx, desc, conn, method, opts...)
}

// TestSharedStreamsManyFiles: 100 Files of different paths, written by
// concurrent callers, go over ceil(100/16) shared streams; each file ends
// as written. One file deleted mid-way fails its writes NOT_FOUND
// (fs.ErrNotExist) and the others go on; one renamed takes its later
// writes under its new name.
func TestSharedStreamsManyFiles(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	counter := &streamCounter{}
	c := dial(t, d.addr, client.WithSharedStreams(16), client.WithDialOptions(grpc.WithStreamInterceptor(counter.interceptor)))
	const files = 100
	fs_ := make([]*client.File, files)
	for i := range fs_ {
		f := openFile(t, ctx, c, fmt.Sprintf("many/%03d", i))
		fs_[i] = f
	}
	if got, most := counter.n.Load(), int64((files+15)/16); got > most {
		t.Errorf("%d files opened %d streams, want at most %d", files, got, most)
	}
	write := func(round int) {
		var wg sync.WaitGroup
		for i, f := range fs_ {
			wg.Go(func() {
				_, err := f.WriteAt([]byte{byte('a' + round)}, int64(round))
				switch {
				case i == 0 && round > 0:
					if !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("file 0, deleted, round %d: %v, want fs.ErrNotExist", round, err)
					}
				case err != nil:
					t.Errorf("file %d round %d: %v", i, round, err)
				}
			})
		}
		wg.Wait()
	}
	write(0)
	if err := c.Delete(ctx, "many/000"); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, "many/001", "many/renamed"); err != nil {
		t.Fatal(err)
	}
	write(1)
	write(2)
	for i, f := range fs_ {
		if err := f.Close(); err != nil && i != 0 {
			t.Errorf("Close of file %d: %v", i, err)
		}
	}
	for i := 2; i < files; i++ {
		if got := string(d.onDisk(t, fmt.Sprintf("many/%03d", i))); got != "abc" {
			t.Errorf("many/%03d: %q, want %q", i, got, "abc")
		}
	}
	if got := string(d.onDisk(t, "many/renamed")); got != "abc" {
		t.Errorf("many/renamed: %q, want %q", got, "abc")
	}
}

// declaredFiles is a FileService whose WriteStream answers every declared
// file open and acks every write, holding nothing: a stand-in for a
// daemon of unbounded open files, to count what 100,000 Files cost.
type declaredFiles struct {
	filewritev1.UnimplementedFileServiceServer
	streams, most, declared atomic.Int64
}

func (s *declaredFiles) WriteStream(ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) error {
	s.streams.Add(1)
	held := int64(0)
	for {
		req, err := ss.Recv()
		if err != nil {
			return nil
		}
		resp := &filewritev1.WriteStreamResponse{}
		for _, f := range req.GetFiles() {
			resp.Files = append(resp.Files, &filewritev1.StreamFileStatus{Index: f.GetIndex()})
			s.declared.Add(1)
			held++
		}
		held -= int64(len(req.GetClose()))
		for cur := s.most.Load(); held > cur && !s.most.CompareAndSwap(cur, held); cur = s.most.Load() {
		}
		resp.Acks = ackedInFull(req)
		if err := ss.Send(resp); err != nil {
			return err
		}
	}
}

// TestHundredThousandFiles: one Client opens 100,000 Files of different
// paths and writes to each: they go over ceil(100,000/4096) streams, no
// stream holds more than 4096 files, and the idle Files keep no
// goroutine.
func TestHundredThousandFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 opens")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &declaredFiles{}
	srv := grpc.NewServer()
	filewritev1.RegisterFileServiceServer(srv, fake)
	go srv.Serve(lis)
	defer srv.Stop()
	// 100,000 opens take about a minute under -race on two busy CPUs.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := client.New(conn)
	defer c.Close()
	const files, workers = 100_000, 64
	opened := make([]*client.File, files)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < files; i = next.Add(1) - 1 {
				f, err := c.Open(ctx, fmt.Sprintf("d%03d/f%06d", i%1000, i))
				if err != nil {
					t.Errorf("open %d: %v", i, err)
					return
				}
				if _, err := f.WriteAt([]byte("x"), 0); err != nil {
					t.Errorf("write %d: %v", i, err)
				}
				opened[i] = f
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// Idle Files keep no goroutine: their senders exit once nothing is
	// queued or in flight.
	testutil.WaitFor(t, "the idle Files' senders to exit", func() bool { return runtime.NumGoroutine() < 1000 })
	most := int64((files + client.DefaultFilesPerStream - 1) / client.DefaultFilesPerStream)
	if got := fake.streams.Load(); got > most {
		t.Errorf("%d Files opened %d streams, want at most %d", files, got, most)
	}
	if got := fake.most.Load(); got > client.DefaultFilesPerStream {
		t.Errorf("a stream held %d files, want at most %d", got, client.DefaultFilesPerStream)
	}
	if got := fake.declared.Load(); got != files {
		t.Errorf("%d files declared, want %d", got, files)
	}
	for _, f := range opened {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

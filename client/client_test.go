package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service"
	"github.com/filewrite/filewrite/store/faultfs"
)

func dial(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startAndDial starts a daemon and dials it, for a test that takes
// testContext's context.
func startAndDial(t *testing.T) (*daemon, context.Context, *client.Client) {
	t.Helper()
	d := startDaemon(t, nil)
	return d, testContext(t), dial(t, d.addr)
}

// openFile opens path on c, failing the test if it cannot.
func openFile(t *testing.T, ctx context.Context, c *client.Client, path string, opts ...client.FileOption) *client.File {
	t.Helper()
	f, err := c.Open(ctx, path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

// TestFileCalls: every call of a File against a real daemon, each checked
// by what the next one sees.
func TestFileCalls(t *testing.T) {
	d, ctx, c := startAndDial(t)
	f := openFile(t, ctx, c, "calls/f", client.WithSync(client.SyncData))
	data := pattern(3*4096, 1)
	if n, err := f.WriteAt(data, 0); n != len(data) || err != nil {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	n, size, err := f.Write(ctx, []byte("tail"), int64(len(data)), client.SyncFull)
	if n != 4 || size != int64(len(data))+4 || err != nil {
		t.Fatalf("Write: %d, size %d, %v; want 4, %d, nil", n, size, err, len(data)+4)
	}
	got := make([]byte, len(data)+10)
	if n, err := f.ReadAt(got, 0); n != len(data)+4 || !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt past the end: %d, %v; want %d, io.EOF", n, err, len(data)+4)
	}
	if !bytes.Equal(got[:len(data)], data) || string(got[len(data):len(data)+4]) != "tail" {
		t.Errorf("ReadAt returned other bytes than written")
	}
	if err := f.SyncData(ctx); err != nil {
		t.Errorf("Sync: %v", err)
	}
	if err := f.PunchHole(ctx, 4096, 4096); err != nil {
		t.Errorf("PunchHole: %v", err)
	}
	if err := f.ZeroRange(ctx, 0, 100); err != nil {
		t.Errorf("ZeroRange: %v", err)
	}
	if err := f.Allocate(ctx, 16384, 4096); err != nil {
		t.Errorf("Allocate: %v", err)
	}
	st, err := f.Stat(ctx)
	if err != nil || st.Size != 20480 || st.BlockSize <= 0 {
		t.Errorf("Stat: %+v, %v; want size 20480", st, err)
	}
	var exts []client.Extent
	for e, eerr := range f.Extents(ctx, 0, 0) {
		if err = eerr; err != nil {
			break
		}
		exts = append(exts, e)
	}
	want := []client.Extent{
		{Offset: 0, Length: 4096, State: client.ExtentWritten},
		{Offset: 4096, Length: 4096, State: client.ExtentHole},
		{Offset: 8192, Length: 8192, State: client.ExtentWritten},
		{Offset: 16384, Length: 4096, State: client.ExtentUnwritten},
	}
	if err != nil || !slices.Equal(exts, want) {
		t.Errorf("Extents: %v, %v; want %v", exts, err, want)
	}
	if err := f.Truncate(ctx, 5); err != nil {
		t.Errorf("Truncate: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got, want := d.onDisk(t, "calls/f"), make([]byte, 5); !bytes.Equal(got, want) {
		t.Errorf("file after Truncate: %v, want %v", got, want)
	}
}

// TestOpenErrors: Open reports what keeps the daemon from opening the file.
func TestOpenErrors(t *testing.T) {
	d := startDaemon(t, func(c *service.Config) { c.Store.MaxOpenFiles = 1 })
	ctx := testContext(t)
	c := dial(t, d.addr)
	for _, tt := range []struct {
		path string
		want codes.Code
	}{
		{"", codes.InvalidArgument},
		{"../escape", codes.InvalidArgument},
		{"a", codes.OK},
		{"b", codes.ResourceExhausted}, // "a" holds the only open file
	} {
		f, err := c.Open(ctx, tt.path)
		if got := status.Code(err); got != tt.want {
			t.Errorf("Open(%q): %v, want %v", tt.path, err, tt.want)
		}
		if err == nil {
			defer f.Close()
		}
	}
}

// TestSplitWrites: writes and reads larger than a message go in pieces.
func TestSplitWrites(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := dial(t, d.addr, client.WithMaxMessageBytes(4096))
	f := openFile(t, ctx, c, "split/f")
	defer f.Close()
	data := pattern(50000, 7)
	if n, err := f.WriteAt(data, 3); n != len(data) || err != nil {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 3); n != len(data) || err != nil {
		t.Fatalf("ReadAt: %d, %v", n, err)
	}
	if !bytes.Equal(got, data) {
		t.Error("read back other bytes than written")
	}
}

// countingConn counts the writes per WriteStream message a client sends,
// and can hold the first message that carries writes until released.
type countingConn struct {
	mu       sync.Mutex
	messages []int // writes per message, opening messages left out
	hold     chan struct{}
	held     chan struct{} // closed when a message is held
	holdOnce sync.Once
}

func (cc *countingConn) interceptor(ctx context.Context, desc *grpc.StreamDesc, conn *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, conn, method, opts...)
	return countingStream{s, cc}, err
}

type countingStream struct {
	grpc.ClientStream
	cc *countingConn
}

func (s countingStream) SendMsg(m any) error {
	if n, ok := client.WritesIn(m); ok {
		s.cc.mu.Lock()
		s.cc.messages = append(s.cc.messages, n)
		s.cc.mu.Unlock()
		s.cc.holdOnce.Do(func() {
			close(s.cc.held)
			<-s.cc.hold
		})
	}
	return s.ClientStream.SendMsg(m)
}

// TestCoalescing: callers who write while a message is being sent go
// together in the next one, and each gets its own result.
func TestCoalescing(t *testing.T) {
	d := startDaemon(t, func(c *service.Config) { c.Store.MaxFileSize = 1 << 20 })
	ctx := testContext(t)
	counter := &countingConn{hold: make(chan struct{}), held: make(chan struct{})}
	conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStreamInterceptor(counter.interceptor))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := client.New(conn)
	defer c.Close()
	f := openFile(t, ctx, c, "coalesce/f")
	const callers = 16
	type result struct {
		n   int
		err error
	}
	results := make([]result, callers)
	offset := func(i int) int64 {
		switch i {
		case 5:
			return -1 // INVALID_ARGUMENT
		case 9:
			return 1 << 20 // past --max-file-size: OUT_OF_RANGE
		}
		return int64(i) * 100
	}
	var wg sync.WaitGroup
	write := func(i int) {
		results[i].n, results[i].err = f.WriteAt([]byte(fmt.Sprintf("caller %02d", i)), offset(i))
	}
	wg.Go(func() { write(0) })
	<-counter.held // caller 0's message is being sent
	for i := 1; i < callers; i++ {
		wg.Go(func() { write(i) })
	}
	testutil.WaitFor(t, "every caller to queue", func() bool { return client.Queued(f) == callers-1 })
	close(counter.hold)
	wg.Wait()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := counter.messages, []int{1, callers - 1}; !slices.Equal(got, want) {
		t.Errorf("writes per message %v, want %v: the callers who came during a send share the next message", got, want)
	}
	content := d.onDisk(t, "coalesce/f")
	for i, r := range results {
		want := codes.OK
		switch i {
		case 5:
			want = codes.InvalidArgument
		case 9:
			want = codes.OutOfRange
		}
		if got := status.Code(r.err); got != want {
			t.Errorf("caller %d: %v, want %v", i, r.err, want)
			continue
		}
		if want != codes.OK {
			continue
		}
		text := fmt.Sprintf("caller %02d", i)
		if r.n != len(text) || string(content[offset(i):offset(i)+int64(len(text))]) != text {
			t.Errorf("caller %d: wrote %d bytes; the file holds %q there", i, r.n, content[offset(i):offset(i)+int64(len(text))])
		}
	}
}

// TestBrokenStream: a stream that breaks fails the writes waiting on it
// with its error, the next write opens a new stream; with WithRetry the
// waiting write is resent instead.
func TestBrokenStream(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			var opts []client.Option
			if retry {
				opts = append(opts, client.WithRetry(1))
			}
			d, p, f := openBehindProxy(t, "broken/f", opts...)
			g := testutil.NewGate(t)
			held := d.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "broken/f", Hold: g.Opened(), Times: 1})
			waiter := make(chan error, 1)
			go func() {
				_, err := f.WriteAt([]byte("held"), 0)
				waiter <- err
			}()
			testutil.WaitFor(t, "the write to be held in the daemon", func() bool { return held.Hits() == 1 })
			p.cut()
			if retry {
				// The resend needs no hold: let the first attempt go too.
				g.Open()
				if err := <-waiter; err != nil {
					t.Errorf("the waiting write, resent: %v, want nil", err)
				}
			} else {
				if err := <-waiter; status.Code(err) != codes.Unavailable {
					t.Errorf("the waiting write: %v, want %v", err, codes.Unavailable)
				}
				g.Open()
			}
			if _, err := f.WriteAt([]byte("next"), 100); err != nil {
				t.Errorf("the next write, on a new stream: %v", err)
			}
			if err := f.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if got := string(d.onDisk(t, "broken/f")[100:]); got != "next" {
				t.Errorf("file at 100: %q, want %q", got, "next")
			}
		})
	}
}

// TestCloseReportsUnseenFailure: a write whose caller stopped waiting and
// which then failed is reported by Close.
func TestCloseReportsUnseenFailure(t *testing.T) {
	d, ctx, c := startAndDial(t)
	f := openFile(t, ctx, c, "unseen/f")
	g := testutil.NewGate(t)
	held := d.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "unseen/f", Hold: g.Opened(), Err: syscall.ENOSPC, Times: 1})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := f.Write(wctx, []byte("doomed"), 0, client.SyncNone)
		done <- err
	}()
	testutil.WaitFor(t, "the write to be held", func() bool { return held.Hits() == 1 })
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("Write whose context ended: %v, want %v", err, codes.Canceled)
	}
	g.Open()
	if err := f.Close(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Close: %v, want the unseen write's %v", err, codes.ResourceExhausted)
	}
}

// TestSharedStream: two Files of one path share a stream; closing one
// leaves the other working.
func TestSharedStream(t *testing.T) {
	d, ctx, c := startAndDial(t)
	a := openFile(t, ctx, c, "shared/f")
	b := openFile(t, ctx, c, "shared/f")
	if _, err := a.WriteAt([]byte("aa"), 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt([]byte("bb"), 2); err != nil {
		t.Fatalf("write through the other File after the first closed: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := string(d.onDisk(t, "shared/f")); got != "aabb" {
		t.Errorf("file: %q, want %q", got, "aabb")
	}
	testutil.WaitFor(t, "the stream's goroutines to end", func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("client.(*fileStream)"))
	})
}

// TestToken: with tokens on, Open fails without WithToken and works with it.
func TestToken(t *testing.T) {
	dir := testutil.Dir(t)
	tokens := dir + "/tokens"
	if err := writeFile(tokens, "t0ken\n"); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *service.Config) { c.AuthTokenFile = tokens })
	ctx := testContext(t)
	if _, err := dial(t, d.addr).Open(ctx, "tok/f"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Open without a token: %v, want %v", err, codes.Unauthenticated)
	}
	f, err := dial(t, d.addr, client.WithToken("t0ken")).Open(ctx, "tok/f")
	if err != nil {
		t.Fatalf("Open with the token: %v", err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Errorf("WriteAt with the token: %v", err)
	}
	if _, err := f.Stat(ctx); err != nil {
		t.Errorf("Stat with the token: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Error(err)
	}
}

// fakeFiles is a FileService whose Read can lie about its CRC, and which
// records the path header of every call.
type fakeFiles struct {
	filewritev1.UnimplementedFileServiceServer
	badCRC  atomic.Bool
	mu      sync.Mutex
	headers map[string][]string // method → filewrite-path values seen
}

func (s *fakeFiles) record(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.headers[method] = append(s.headers[method], md.Get(client.PathHeader)...)
	s.mu.Unlock()
}

func (s *fakeFiles) Read(ctx context.Context, req *filewritev1.ReadRequest) (*filewritev1.ReadResponse, error) {
	s.record(ctx, "Read")
	data := bytes.Repeat([]byte("r"), int(req.GetLength()))
	sum := crc32c(data)
	if s.badCRC.Load() {
		sum ^= 1
	}
	return &filewritev1.ReadResponse{Data: data, Crc32C: &sum}, nil
}

func (s *fakeFiles) Stat(ctx context.Context, _ *filewritev1.StatRequest) (*filewritev1.StatResponse, error) {
	s.record(ctx, "Stat")
	return &filewritev1.StatResponse{}, nil
}

func (s *fakeFiles) WriteStream(ss grpc.BidiStreamingServer[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]) error {
	s.record(ss.Context(), "WriteStream")
	for {
		req, err := ss.Recv()
		if err != nil {
			return nil
		}
		if err := ss.Send(&filewritev1.WriteStreamResponse{Acks: ackedInFull(req)}); err != nil {
			return err
		}
	}
}

// ackedInFull is what a fake daemon that writes everything answers to
// req's writes: each acked with all its bytes written.
func ackedInFull(req *filewritev1.WriteStreamRequest) []*filewritev1.StreamAck {
	var acks []*filewritev1.StreamAck
	for _, w := range req.GetWrites() {
		acks = append(acks, &filewritev1.StreamAck{Id: w.GetId(), BytesWritten: int64(len(w.GetData()))})
	}
	return acks
}

// TestReadAtChecksCRC: ReadAt refuses data whose CRC-32C does not match
// the one sent with it; and every call carries the path header.
func TestReadAtChecksCRC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeFiles{headers: map[string][]string{}}
	srv := grpc.NewServer()
	filewritev1.RegisterFileServiceServer(srv, fake)
	go srv.Serve(lis)
	defer srv.Stop()
	ctx := testContext(t)
	c := dial(t, lis.Addr().String(), client.WithSharedStreams(0)) // the fake speaks one file per stream
	f := openFile(t, ctx, c, "crc/f")
	buf := make([]byte, 100)
	if n, err := f.ReadAt(buf, 0); n != 100 || err != nil {
		t.Errorf("ReadAt with a good CRC: %d, %v", n, err)
	}
	fake.badCRC.Store(true)
	if _, err := f.ReadAt(buf, 0); status.Code(err) != codes.DataLoss {
		t.Errorf("ReadAt with a bad CRC: %v, want %v", err, codes.DataLoss)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	for _, m := range []string{"WriteStream", "Read", "Stat"} {
		if got := fake.headers[m]; len(got) == 0 || slices.ContainsFunc(got, func(p string) bool { return p != "crc/f" }) {
			t.Errorf("%s: %s headers %q, want crc/f on every call", m, client.PathHeader, got)
		}
	}
}

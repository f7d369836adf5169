package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// zerosCompressor is a gRPC compressor for tests that counts what the
// daemon decompresses. It encodes runs of zeros by their length, so that a
// client sends a 64 MiB message of zeros in a few bytes, as gzip nearly
// does, without the test spending its time compressing.
type zerosCompressor struct {
	decompressed atomic.Int64 // bytes handed out by every Decompress
}

const zerosCompressorName = "filewrite-test-zeros"

var zeros = &zerosCompressor{}

func init() { encoding.RegisterCompressor(zeros) }

func (*zerosCompressor) Name() string { return zerosCompressorName }

// The encoding is a sequence of records: a kind byte, 0 for a run of zeros
// or 1 for literal bytes, then the length as a uvarint, then for a literal
// its bytes.
func (*zerosCompressor) Compress(w io.Writer) (io.WriteCloser, error) {
	return &zerosWriter{w: bufio.NewWriter(w)}, nil
}

type zerosWriter struct{ w *bufio.Writer }

func (z *zerosWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := zeroPrefix(p)
		if i > 0 {
			z.record(0, uint64(i))
			p = p[i:]
			continue
		}
		for i < len(p) && p[i] != 0 {
			i++
		}
		z.record(1, uint64(i))
		z.w.Write(p[:i])
		p = p[i:]
	}
	return n, nil
}

var zeroBlock = make([]byte, 1<<20)

// zeroPrefix is how many bytes p starts with are zero, found a block at a
// time: the race detector makes a loop over 64 MiB slow.
func zeroPrefix(p []byte) int {
	i := 0
	for len(p)-i >= len(zeroBlock) && bytes.Equal(p[i:i+len(zeroBlock)], zeroBlock) {
		i += len(zeroBlock)
	}
	for i < len(p) && p[i] == 0 {
		i++
	}
	return i
}

func (z *zerosWriter) record(kind byte, n uint64) {
	z.w.WriteByte(kind)
	z.w.Write(binary.AppendUvarint(nil, n))
}

func (z *zerosWriter) Close() error { return z.w.Flush() }

func (c *zerosCompressor) Decompress(r io.Reader) (io.Reader, error) {
	return &zerosReader{r: bufio.NewReader(r), c: c}, nil
}

type zerosReader struct {
	r       *bufio.Reader
	c       *zerosCompressor
	kind    byte
	pending uint64 // bytes left in the current record
}

func (z *zerosReader) Read(p []byte) (int, error) {
	for z.pending == 0 {
		kind, err := z.r.ReadByte()
		if err != nil {
			return 0, err // io.EOF at the end
		}
		if z.pending, err = binary.ReadUvarint(z.r); err != nil {
			return 0, fmt.Errorf("zeros record: %w", err)
		}
		z.kind = kind
	}
	if uint64(len(p)) > z.pending {
		p = p[:z.pending]
	}
	var n int
	if z.kind == 0 {
		clear(p)
		n = len(p)
	} else {
		var err error
		if n, err = z.r.Read(p); err != nil && !errors.Is(err, io.EOF) {
			return n, err
		}
	}
	z.pending -= uint64(n)
	z.c.decompressed.Add(int64(n))
	return n, nil
}

// TestStrangerIsRefusedBeforeItsMessage: with tokens, calls without one
// are refused when their headers arrive, so the daemon never reads or
// decompresses their messages: sixteen 64 MiB Writes that compress to a
// few bytes cost it nothing to decompress, where checking the token after
// the message arrived cost it 1 GiB.
func TestStrangerIsRefusedBeforeItsMessage(t *testing.T) {
	d := startAuthDaemon(t)
	ctx := testContext(t)
	big := &filewritev1.WriteRequest{Path: "existing.bin", Data: make([]byte, 64<<20)}
	compressed := grpc.UseCompressor(zerosCompressorName)
	wire, err := proto.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	encodedOnce := grpc.ForceCodecV2(&testutil.OnceEncoded{Msg: big, Wire: wire})

	files := testutil.Snapshot(t, d.root)
	before := zeros.decompressed.Load()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = d.client.Write(ctx, big, compressed, encodedOnce)
		})
		if i%4 == 3 {
			wg.Wait() // four at a time: the client's own copies add up
		}
	}
	for i, err := range errs {
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("stranger's write %d: %v, want UNAUTHENTICATED", i, err)
		}
	}
	if got := zeros.decompressed.Load() - before; got != 0 {
		t.Errorf("the daemon decompressed %d bytes of strangers' messages, want 0", got)
	}
	testutil.CheckUnchanged(t, d.root, files)

	// The same kind of message with a token is decompressed, and counted.
	before = zeros.decompressed.Load()
	small := &filewritev1.WriteRequest{Path: "zeros.bin", Data: make([]byte, 1<<20)}
	if _, err := d.client.Write(withAuth(ctx, "Bearer "+tokenAlpha), small, compressed); err != nil {
		t.Fatalf("write with a token: %v", err)
	}
	if got := zeros.decompressed.Load() - before; got < 1<<20 {
		t.Errorf("a write with a token decompressed %d bytes, want at least %d: the count does not work", got, 1<<20)
	}
}

// TestGatewayServesManyAtOnce: 64 REST requests are in the store at once.
// The gateway reaches gRPC over one connection, so a per-connection bound
// on concurrent calls below that would hold REST callers back.
func TestGatewayServesManyAtOnce(t *testing.T) {
	const n = 64
	var entered atomic.Int32
	all := make(chan struct{})
	hooks := &store.Hooks{InsideWrite: func(ctx context.Context, path, _, _ string) {
		if !strings.HasPrefix(path, "many/") {
			return
		}
		if entered.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-ctx.Done():
		}
	}}
	d := startDaemon(t, func(c *Config) { c.Store.Hooks = hooks })
	ctx := testContext(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	var wg sync.WaitGroup
	statuses := make([]string, n)
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, "PUT", fmt.Sprintf("%s/v1/files/many/%d.bin", d.url, i), strings.NewReader("x"))
			if err != nil {
				statuses[i] = err.Error()
				return
			}
			resp, err := client.Do(req)
			if err != nil {
				statuses[i] = err.Error()
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.Status
		})
	}
	wg.Wait()
	for i, got := range statuses {
		if got != "201 Created" {
			t.Errorf("PUT many/%d.bin: %s, want 201 Created (%d of %d requests reached the store together)", i, got, entered.Load(), n)
		}
	}
}

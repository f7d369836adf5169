package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store/faultfs"
)

// calls counts the unary Append calls and the stream messages a Client
// sends, through interceptors on its connection.
type calls struct {
	appends, messages atomic.Int64
}

func (n *calls) option() client.Option {
	return client.WithDialOptions(
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if strings.HasSuffix(method, "/Append") {
				n.appends.Add(1)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			return countedStream{s, n}, err
		}))
}

type countedStream struct {
	grpc.ClientStream
	n *calls
}

func (s countedStream) SendMsg(m any) error {
	s.n.messages.Add(1)
	return s.ClientStream.SendMsg(m)
}

// TestAppendConcurrent appends from many goroutines through one File and
// checks that the offsets returned tile the file with each append's bytes,
// each goroutine's in the order of its calls. Appends go on the File's
// stream, sharing its messages; with a stream per path
// (WithSharedStreams(0)), or when larger than a piece, they are unary
// Append calls.
func TestAppendConcurrent(t *testing.T) {
	for _, c := range []struct {
		name      string
		opts      []client.Option
		pad       int // bytes added to each record
		wantUnary bool
	}{
		{"stream", nil, 0, false},
		{"stream per path", []client.Option{client.WithSharedStreams(0)}, 0, true},
		{"over a piece", []client.Option{client.WithMaxMessageBytes(64)}, 16, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startDaemon(t, nil)
			ctx := testContext(t)
			var n calls
			cl := dial(t, d.addr, append(c.opts, n.option())...)
			f, err := cl.Open(ctx, "log")
			if err != nil {
				t.Fatal(err)
			}
			const writers, each = 16, 25
			type landed struct {
				off  int64
				data []byte
			}
			var mu sync.Mutex
			var all []landed
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					last := int64(-1)
					for i := range each {
						data := fmt.Appendf(nil, "[%d:%d%s]", w, i, strings.Repeat("-", c.pad))
						off, err := f.Append(ctx, data)
						if err != nil {
							t.Error(err)
							return
						}
						if off <= last {
							t.Errorf("writer %d: append %d at %d, its previous at %d: want increasing offsets", w, i, off, last)
						}
						last = off
						mu.Lock()
						all = append(all, landed{off, data})
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			slices.SortFunc(all, func(a, b landed) int { return int(a.off - b.off) })
			var want []byte
			for _, l := range all {
				if l.off != int64(len(want)) {
					t.Fatalf("an append at %d, want %d: the offsets do not tile the file", l.off, len(want))
				}
				want = append(want, l.data...)
			}
			if got := d.onDisk(t, "log"); !bytes.Equal(got, want) {
				t.Errorf("file: got %q, want %q", got, want)
			}
			wantAppends := int64(0)
			if c.wantUnary {
				wantAppends = writers * each
			}
			if got := n.appends.Load(); got != wantAppends {
				t.Errorf("unary Append calls: got %d, want %d", got, wantAppends)
			}
			t.Logf("%d appends, %d unary calls, %d stream messages", writers*each, n.appends.Load(), n.messages.Load())
		})
	}
}

// TestAppendRetryLandsOnce cuts the connection while an append is held in
// the daemon, so that its answer is lost after its bytes were written:
// with WithRetry the resend carries the same append ID and gets the first
// offset, and the bytes are in the file once; without it the caller gets
// UNAVAILABLE. On the File's stream the resend goes on a new stream,
// while the first is still held in the daemon; as a unary call, in a new
// call.
func TestAppendRetryLandsOnce(t *testing.T) {
	for _, transport := range []struct {
		name string
		opts []client.Option
	}{
		{"stream", nil},
		{"unary", []client.Option{client.WithSharedStreams(0)}},
	} {
		for _, retry := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/retry=%v", transport.name, retry), func(t *testing.T) {
				ctx := testContext(t)
				opts := transport.opts
				if retry {
					opts = append(opts, client.WithRetry(3))
				}
				d, p, f := openBehindProxy(t, "log", opts...)
				if _, err := f.Append(ctx, []byte("head|")); err != nil {
					t.Fatal(err)
				}
				g := testutil.NewGate(t)
				held := d.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "log", Hold: g.Opened(), Times: 1})
				type result struct {
					off int64
					err error
				}
				done := make(chan result, 1)
				go func() {
					off, err := f.Append(ctx, []byte("once|"))
					done <- result{off, err}
				}()
				testutil.WaitFor(t, "the append to be held in the daemon", func() bool { return held.Hits() == 1 })
				p.cut()
				if !retry {
					if r := <-done; status.Code(r.err) != codes.Unavailable {
						t.Errorf("the append: got %d, %v, want UNAVAILABLE", r.off, r.err)
					}
					g.Open()
					return
				}
				g.Open()
				r := <-done
				if r.err != nil || r.off != 5 {
					t.Errorf("the append, resent: got %d, %v, want offset 5", r.off, r.err)
				}
				if off, err := f.Append(ctx, []byte("tail")); err != nil || off != 10 {
					t.Errorf("the next append: got %d, %v, want offset 10", off, err)
				}
				if got, want := string(d.onDisk(t, "log")), "head|once|tail"; got != want {
					t.Errorf("file: got %q, want %q", got, want)
				}
			})
		}
	}
}

// TestAppendCutsLandOnce appends fixed-size records from many goroutines
// through one File while the connection is cut again and again. With
// WithRetry every append succeeds and the file is every record once, each
// at the offset its append returned; without it, appends fail only with
// UNAVAILABLE, every acknowledged record is at its offset once, and the
// file holds whole records, none twice (a failed append may have landed).
func TestAppendCutsLandOnce(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			ctx := testContext(t)
			var opts []client.Option
			if retry {
				opts = append(opts, client.WithRetry(20))
			}
			d, p, f := openBehindProxy(t, "log", opts...)
			const writers, each, size, cuts = 8, 60, 24, 4
			record := func(w, i int) []byte { return fmt.Appendf(nil, "%-*s\n", size-1, fmt.Sprintf("w%d r%d", w, i)) }
			offsets, errs := testutil.ConcurrentAppends(t, writers, each, cuts,
				func(w, i int) (int64, error) { return f.Append(ctx, record(w, i)) }, p.cut)
			got := d.onDisk(t, "log")
			if len(got)%size != 0 {
				t.Fatalf("the file is %d bytes, not a whole number of %d-byte records", len(got), size)
			}
			seen := map[string]int{}
			for off := 0; off < len(got); off += size {
				seen[string(got[off:off+size])]++
			}
			failed := 0
			for w := range writers {
				for i := range each {
					r := record(w, i)
					if n := seen[string(r)]; n > 1 {
						t.Errorf("writer %d, record %d: in the file %d times", w, i, n)
					}
					if err := errs[w][i]; err != nil {
						failed++
						if retry || status.Code(err) != codes.Unavailable {
							t.Errorf("writer %d, record %d: %v", w, i, err)
						}
						continue
					}
					if off := offsets[w][i]; off+size > int64(len(got)) || !bytes.Equal(got[off:off+size], r) {
						t.Errorf("writer %d, record %d: acknowledged at %d, not there", w, i, off)
					}
				}
			}
			if len(seen) != len(got)/size {
				t.Errorf("%d records in the file, %d of them distinct", len(got)/size, len(seen))
			}
			t.Logf("%d appends, %d failed, %d records in the file", writers*each, failed, len(got)/size)
		})
	}
}

// TestAppendCancelled: an append whose context ends while the daemon
// holds it returns the context's error at once; the daemon carries out the
// range it took, the append lands once, and the next append goes after it.
func TestAppendCancelled(t *testing.T) {
	d, ctx, c := startAndDial(t)
	f := openFile(t, ctx, c, "log")
	g := testutil.NewGate(t)
	held := d.ffs.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "log", Hold: g.Opened(), Times: 1})
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := f.Append(actx, []byte("held|"))
		done <- err
	}()
	testutil.WaitFor(t, "the append to be held in the daemon", func() bool { return held.Hits() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled append: got %v, want context.Canceled", err)
	}
	g.Open()
	if off, err := f.Append(ctx, []byte("next")); err != nil || off != 5 {
		t.Errorf("the next append: got %d, %v, want offset 5", off, err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v, want nil (the cancelled append succeeded)", err)
	}
	if got, want := string(d.onDisk(t, "log")), "held|next"; got != want {
		t.Errorf("file: got %q, want %q", got, want)
	}
}

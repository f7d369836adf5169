package client_test

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestAppendConcurrent appends from many goroutines through one File and
// checks that the offsets returned tile the file with each append's bytes.
func TestAppendConcurrent(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := dial(t, d.addr)
	f, err := c.Open(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 25
	type landed struct {
		off  int64
		data []byte
	}
	var mu sync.Mutex
	var all []landed
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				data := []byte(fmt.Sprintf("[%d:%d]", w, i))
				off, err := f.Append(ctx, data)
				if err != nil {
					t.Error(err)
					return
				}
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
}

// TestAppendRetryLandsOnce cuts the connection while an append is held in
// the daemon, so that its answer is lost after its bytes were written:
// with WithRetry the resend carries the same append ID and gets the first
// offset, and the bytes are in the file once; without it the caller gets
// UNAVAILABLE.
func TestAppendRetryLandsOnce(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			d := startDaemon(t, nil)
			ctx := testContext(t)
			p := newProxy(t, d.addr)
			var opts []client.Option
			if retry {
				opts = append(opts, client.WithRetry(3))
			}
			c := dial(t, p.addr(), opts...)
			f, err := c.Open(ctx, "log")
			if err != nil {
				t.Fatal(err)
			}
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

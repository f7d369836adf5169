package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// restartable is a daemon process on a unix socket that a test can kill
// with SIGKILL, as a crash would, and start again on the same socket and
// root.
type restartable struct {
	t          *testing.T
	bin        string
	root, sock string
	p          *daemonproc.Process
}

func newRestartable(t *testing.T, bin string) *restartable {
	// A unix socket's path is short (108 bytes): not below the test's
	// own directory.
	sockDir, err := os.MkdirTemp("", "fw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	r := &restartable{t: t, bin: bin, root: filepath.Join(testutil.Dir(t), "root"), sock: filepath.Join(sockDir, "s")}
	r.start()
	return r
}

func (r *restartable) start() {
	ctx, cancel := context.WithTimeout(r.t.Context(), 30*time.Second)
	defer cancel()
	r.p, _ = testutil.StartDaemon(r.t, ctx, r.bin, "--root", r.root, "--grpc-addr", "unix:"+r.sock, "--http-addr", "")
}

func (r *restartable) kill() {
	r.p.Kill()
	r.p.Wait()
}

// TestRetryAcrossRestart: writers fill a file through a Client while the
// daemon process is SIGKILLed mid-stream and started again. With
// WithRetry, every write returns nil and the file holds every byte. Without
// it, the writes cut off fail, each with its error, and every write that
// returned nil is in the file: none is lost silently. Either way, the File
// writes on once the daemon is back: its broken stream is re-opened.
func TestRetryAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts the daemon binary")
	}
	bin := daemonBin
	for _, retry := range []bool{true, false} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			d := newRestartable(t, bin)
			var opts []client.Option
			if retry {
				opts = append(opts, client.WithRetry(20))
			}
			c, err := client.Dial("unix:"+d.sock, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			f, err := c.Open(ctx, "restart/f", client.WithTimeout(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			const writers, blocks, bs = 4, 200, 4096
			block := func(w, i int) (int64, []byte) {
				off := int64(w*blocks+i) * bs
				return off, bytes.Repeat([]byte{byte(w*blocks + i)}, bs)
			}
			var acked atomic.Int64
			errs := make([][]error, writers)
			var wg sync.WaitGroup
			for w := range writers {
				errs[w] = make([]error, blocks)
				wg.Go(func() {
					for i := range blocks {
						off, data := block(w, i)
						_, errs[w][i] = f.WriteAt(data, off)
						if errs[w][i] == nil {
							acked.Add(1)
						}
					}
				})
			}
			testutil.WaitFor(t, "writes to be acknowledged before the kill", func() bool { return acked.Load() >= writers*20 })
			d.kill()
			// A Stat during the outage: gRPC's retry policy (service
			// config) makes it wait for the daemon under WithRetry.
			statDone := make(chan error, 1)
			go func() {
				_, err := c.Stat(ctx, "restart/f")
				statDone <- err
			}()
			time.Sleep(300 * time.Millisecond) // an outage, not a check
			d.start()
			wg.Wait()
			if err := <-statDone; retry && err != nil {
				t.Errorf("Stat during the outage, with WithRetry: %v, want nil", err)
			} else if !retry && status.Code(err) != codes.Unavailable {
				t.Errorf("Stat during the outage, without WithRetry: %v, want UNAVAILABLE", err)
			}

			failed := 0
			for w := range writers {
				for i, err := range errs[w] {
					switch {
					case err == nil:
					case retry:
						t.Errorf("writer %d, block %d: %v, want nil with WithRetry", w, i, err)
					case status.Code(err) != codes.Unavailable:
						t.Errorf("writer %d, block %d: %v, want UNAVAILABLE", w, i, err)
					default:
						failed++
					}
				}
			}
			if !retry && failed == 0 {
				t.Log("no write was cut off by the kill: the writers were all between writes")
			}
			// Once the daemon is back, the File writes on: a new stream.
			if _, err := f.WriteAt([]byte("after"), writers*blocks*bs); err != nil {
				t.Errorf("write after the restart: %v", err)
			}
			if err := f.Close(); err != nil && retry {
				t.Errorf("Close: %v", err)
			}
			got, err := os.ReadFile(filepath.Join(d.root, "restart/f"))
			if err != nil {
				t.Fatal(err)
			}
			for w := range writers {
				for i, err := range errs[w] {
					off, data := block(w, i)
					if err == nil && !bytes.Equal(got[off:off+bs], data) {
						t.Errorf("writer %d, block %d: acknowledged, but the file holds other bytes", w, i)
					}
				}
			}
			if !bytes.Equal(got[writers*blocks*bs:], []byte("after")) {
				t.Errorf("the write after the restart is not in the file")
			}
		})
	}
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestRESTAppendRetryAcrossRestart: scripts append fixed-size records
// with raw POST /v1/files/{path}:append?sync=data&append_id=..., each
// with an id of its own, while the daemon is SIGKILLed and started again
// (on a new port) three times; an append whose reply did not come (the
// connection cut, refused, or a 5xx) is sent again, with the same id, to
// the daemon running then. Every record lies at the offset its 200 named
// (the Filewrite-Offset header), and none is in the file twice; a range a
// killed daemon had reserved and not written may read as zeros, at most
// one per appender and kill.
func TestRESTAppendRetryAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts the daemon binary")
	}
	bin := daemonBin
	root := filepath.Join(testutil.Dir(t), "root")
	var addr atomic.Pointer[string]
	var proc *daemonproc.Process
	start := func() {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		proc, _ = testutil.StartDaemon(t, ctx, bin, "--root", root)
		a := proc.HTTPAddr
		addr.Store(&a)
	}
	start()

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: 10 * time.Second}
	// post sends one append until a daemon answers it, and returns the
	// offset it names.
	post := func(id string, rec []byte) (int64, error) {
		for {
			url := fmt.Sprintf("http://%s/v1/files/rest/log:append?sync=data&append_id=%s", *addr.Load(), id)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(rec))
			if err != nil {
				return 0, err
			}
			req.Header.Set("Content-Type", "application/octet-stream")
			resp, err := hc.Do(req)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == http.StatusOK:
					return strconv.ParseInt(resp.Header.Get("Filewrite-Offset"), 10, 64)
				case resp.StatusCode < 500:
					return 0, fmt.Errorf("append %s: %s: %s", id, resp.Status, body)
				}
			}
			select { // no answer, or the daemon going away: send it again
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return 0, fmt.Errorf("append %s: %w (last: %v)", id, ctx.Err(), err)
			}
		}
	}

	const appenders, each, size, kills = 4, 100, 64, 3
	record := func(w, i int) []byte {
		return []byte(fmt.Sprintf("%-*s\n", size-1, fmt.Sprintf("rest appender %d record %d", w, i)))
	}
	offsets, errs := testutil.ConcurrentAppends(t, appenders, each, kills,
		func(w, i int) (int64, error) { return post(fmt.Sprintf("w%d-%d", w, i), record(w, i)) },
		func() {
			proc.Kill()
			proc.Wait()
			time.Sleep(300 * time.Millisecond) // an outage, not a check
			start()
		})

	checkAppendedOnce(t, filepath.Join(root, "rest/log"), size, record, offsets, errs, kills*appenders)
}

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

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestAppendRetryAcrossRestart: appenders append fixed-size records
// through a Client with WithRetry while the daemon is SIGKILLed and
// started again. Every append returns its offset, and every record lies
// at the offset its append was told. The daemon remembers append IDs in
// memory only, so an append whose first attempt the kill cut off after
// its bytes landed is written again after the restart: at most one such
// record per appender (each has one append in flight) may be there twice,
// and as many ranges that a cut-off append had reserved but not written
// may read as zeros (docs/guarantees.md, appends). Connections cut without
// a restart land every append once (client's TestAppendRetryLandsOnce).
func TestAppendRetryAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and restarts the daemon binary")
	}
	bin := testutil.BuildDaemon(t, testutil.Dir(t), raceEnabled)
	d := newRestartable(t, bin)
	c, err := client.Dial("unix:"+d.sock, client.WithRetry(20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	f, err := c.Open(ctx, "restart/log")
	if err != nil {
		t.Fatal(err)
	}
	const appenders, each, size = 4, 150, 64
	record := func(w, i int) []byte {
		return []byte(fmt.Sprintf("%-*s\n", size-1, fmt.Sprintf("appender %d record %d", w, i)))
	}
	offsets := make([][]int64, appenders)
	errs := make([][]error, appenders)
	var acked atomic.Int64
	var wg sync.WaitGroup
	for w := range appenders {
		offsets[w], errs[w] = make([]int64, each), make([]error, each)
		wg.Go(func() {
			for i := range each {
				offsets[w][i], errs[w][i] = f.Append(ctx, record(w, i))
				if errs[w][i] == nil {
					acked.Add(1)
				}
			}
		})
	}
	testutil.WaitFor(t, "appends to be acknowledged before the kill", func() bool { return acked.Load() >= appenders*20 })
	d.kill()
	time.Sleep(300 * time.Millisecond) // an outage, not a check
	d.start()
	wg.Wait()
	f.Close()

	got, err := os.ReadFile(filepath.Join(d.root, "restart/log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got)%size != 0 {
		t.Fatalf("the file is %d bytes, not a whole number of %d-byte records", len(got), size)
	}
	seen := map[string]int{}
	zeros := 0
	for off := 0; off < len(got); off += size {
		r := got[off : off+size]
		if bytes.Count(r, []byte{0}) == size {
			zeros++
			continue
		}
		seen[string(r)]++
	}
	twice := 0
	for w := range appenders {
		for i := range each {
			if errs[w][i] != nil {
				t.Errorf("appender %d, record %d: %v, want nil with WithRetry", w, i, errs[w][i])
				continue
			}
			off := offsets[w][i]
			if !bytes.Equal(got[off:off+size], record(w, i)) {
				t.Errorf("appender %d, record %d: acknowledged at %d, but the file holds %q there", w, i, off, got[off:off+size])
			}
			switch n := seen[string(record(w, i))]; {
			case n == 2:
				twice++
			case n > 2:
				t.Errorf("appender %d, record %d: in the file %d times", w, i, n)
			}
		}
	}
	if twice > appenders || zeros > appenders {
		t.Errorf("%d records twice and %d zero records: want at most %d of each (one append in flight per appender at the kill)", twice, zeros, appenders)
	}
	t.Logf("%d records, %d twice (resent across the restart), %d zero records", len(got)/size, twice, zeros)
}

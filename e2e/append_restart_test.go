package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestAppendRetryAcrossRestart: appenders append fixed-size records
// through a Client with WithRetry, unsynced and synced, while the daemon
// is SIGKILLed and started again, three times. Every append returns its offset, every record lies at
// the offset its append was told, and none is in the file twice: the
// daemon keeps the append IDs in its journal, so a resend across the
// restart of an append whose bytes landed is answered with its first
// offset, and one whose bytes had not landed is appended once. Ranges
// that a cut-off append had reserved but not written may read as zeros,
// at most one per appender and kill (each has one append in flight; see
// docs/guarantees.md, appends). Connections cut without a restart land
// every append once (client's TestAppendRetryLandsOnce).
func TestAppendRetryAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts the daemon binary")
	}
	bin := daemonBin
	// A synced append spends most of its time between its bytes landing
	// and its reply (the fdatasync): a kill there is what a resend must
	// not land twice.
	for _, mode := range []client.SyncMode{client.SyncNone, client.SyncData} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) { appendAcrossRestarts(t, bin, mode) })
	}
}

func appendAcrossRestarts(t *testing.T, bin string, mode client.SyncMode) {
	d := newRestartable(t, bin)
	c, err := client.Dial("unix:"+d.sock, client.WithRetry(20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	f, err := c.Open(ctx, "restart/log", client.WithSync(mode))
	if err != nil {
		t.Fatal(err)
	}
	const appenders, each, size, kills = 4, 150, 64, 3
	record := func(w, i int) []byte {
		return []byte(fmt.Sprintf("%-*s\n", size-1, fmt.Sprintf("appender %d record %d", w, i)))
	}
	offsets, errs := testutil.ConcurrentAppends(t, appenders, each, kills,
		func(w, i int) (int64, error) { return f.Append(ctx, record(w, i)) },
		func() {
			d.kill()
			time.Sleep(300 * time.Millisecond) // an outage, not a check
			d.start()
		})
	f.Close()

	checkAppendedOnce(t, filepath.Join(d.root, "restart/log"), size, record, offsets, errs, kills*appenders)
}

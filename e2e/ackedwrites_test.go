package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// slot is one write of a load test: a unique pattern at a place no other
// write of the test touches, so that each write can be checked on its own
// whatever order the writes ran in.
type slot struct {
	file string
	off  int64
	data []byte
}

// slotSize is not a multiple of the block size, so that slots share blocks
// and writes of one file interleave below and beyond EOF.
const slotSize = 3001

// loadSlot is writer w's seq-th slot: writers take turns across files and
// offsets.
func loadSlot(files []string, writers, w, seq int) slot {
	file := files[w%len(files)]
	perFile := (writers + len(files) - 1) / len(files)
	index := seq*perFile + w/len(files)
	data := bytes.Repeat(fmt.Appendf(nil, "[%s w%d s%d]", file, w, seq), slotSize/8)
	return slot{file: file, off: int64(index) * slotSize, data: data[:slotSize]}
}

// ackLog collects the slots acknowledged by the daemon, and of those the
// ones it acknowledged as durable.
type ackLog struct {
	mu      sync.Mutex
	acked   []slot // guarded by mu
	durable []slot // guarded by mu
}

func (a *ackLog) add(s slot, durable bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acked = append(a.acked, s)
	if durable {
		a.durable = append(a.durable, s)
	}
}

func (a *ackLog) counts() (acked, durable int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acked), len(a.durable)
}

// grpcLoadWriter writes slots until an RPC fails and returns that error.
// Every odd write asks for SYNC_MODE_DATA; the even ones are plain, and
// every fourth write is followed by an Fsync(data_only), which makes every
// plain write before it durable once it returns.
func grpcLoadWriter(ctx context.Context, c filewritev1.FileServiceClient, log *ackLog, files []string, writers, w int) error {
	var unsynced []slot
	for seq := 0; ; seq++ {
		s := loadSlot(files, writers, w, seq)
		sync := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
		if seq%2 == 1 {
			sync = filewritev1.SyncMode_SYNC_MODE_DATA
		}
		if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: s.file, Offset: s.off, Data: s.data, Sync: sync}); err != nil {
			return err
		}
		if sync == filewritev1.SyncMode_SYNC_MODE_DATA {
			log.add(s, true)
		} else {
			log.add(s, false)
			unsynced = append(unsynced, s)
		}
		if seq%4 == 3 {
			if _, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: s.file, DataOnly: true}); err != nil {
				return err
			}
			for _, u := range unsynced {
				log.add(slot{file: u.file, off: u.off, data: u.data}, true)
			}
			unsynced = unsynced[:0]
		}
	}
}

// httpLoadWriter writes slots with raw PUTs (sync=data every other one)
// until one fails, and returns that failure.
func httpLoadWriter(ctx context.Context, client *http.Client, base string, log *ackLog, files []string, writers, w int) error {
	for seq := 0; ; seq++ {
		s := loadSlot(files, writers, w, seq)
		q := "none"
		if seq%2 == 1 {
			q = "data"
		}
		req, err := http.NewRequestWithContext(ctx, "PUT", fmt.Sprintf("%s/v1/files/%s?offset=%d&sync=%s", base, s.file, s.off, q), bytes.NewReader(s.data))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", mimeOctetStream)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		// 201 when the PUT created its file.
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		log.add(s, q == "data")
	}
}

// checkSlots reports every slot whose bytes are not in got(file).
func checkSlots(t *testing.T, what string, slots []slot, got func(file string) []byte) {
	t.Helper()
	bad := 0
	for _, s := range slots {
		data := got(s.file)
		if end := s.off + int64(len(s.data)); end > int64(len(data)) || !bytes.Equal(data[s.off:end], s.data) {
			if bad++; bad <= 5 {
				t.Errorf("%s: %s [%d, +%d) does not hold what was acknowledged", what, s.file, s.off, len(s.data))
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d slots in all do not hold what was acknowledged", what, bad)
	}
}

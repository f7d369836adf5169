package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
)

// The soak's clients and the model they keep: see soak.go for why the
// model is exact.

// soakFile is one file and its model. Each slot is read and written only
// by its owner's goroutine and the tail only by the tail owner's, so the
// model needs no lock while clients run; the final check runs after they
// have all stopped.
type soakFile struct {
	path  string
	slots [][]byte // slots[k] models bytes [k*soakSlot, (k+1)*soakSlot)
	tail  []byte   // models bytes [base, size): len(tail) is size-base
}

func (f *soakFile) base() int64 { return int64(len(f.slots)) * soakSlot }
func (f *soakFile) size() int64 { return f.base() + int64(len(f.tail)) }

// soakClient is one client's state; its counters are its own, merged at
// the end.
type soakClient struct {
	id     int
	file   *soakFile
	slot   int // -1: the tail owner
	rng    *rand.Rand
	c      filewritev1.FileServiceClient
	buf    []byte
	lat    map[string][]time.Duration
	expErr map[string]int
	unexp  map[string]int
	notes  []string
	// ownDaemon is whether the harness started the server, and so knows
	// its --max-file-size.
	ownDaemon bool
}

func (c *soakClient) unexpected(op, format string, args ...any) {
	c.unexp[op]++
	if len(c.notes) < 5 {
		c.notes = append(c.notes, fmt.Sprintf("client %d %s %s: ", c.id, op, c.file.path)+fmt.Sprintf(format, args...))
	}
}

// record files a finished call: its latency if it succeeded, an unexpected
// error otherwise.
func (c *soakClient) record(op string, t0 time.Time, err error) bool {
	if err != nil {
		c.unexpected(op, "%v", err)
		return false
	}
	c.lat[op] = append(c.lat[op], time.Since(t0))
	return true
}

// randRange picks [off, off+n) inside [0, limit): half of the time whole
// blocks, half of the time any bytes, so that both the aligned paths and
// the partial-block ones are exercised.
func (c *soakClient) randRange(limit int64) (off, n int64) {
	const block = 4096
	if c.rng.IntN(2) == 0 && limit >= block {
		off = c.rng.Int64N(limit/block) * block
		n = (1 + c.rng.Int64N(min(soakMaxWrite/block, (limit-off)/block))) * block
		return off, n
	}
	off = c.rng.Int64N(limit)
	n = 1 + c.rng.Int64N(min(soakMaxWrite, limit-off))
	return off, n
}

func (c *soakClient) randomData(n int64) []byte {
	b := c.buf[:n]
	for i := 0; i < len(b); i += 8 {
		v := c.rng.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func zero(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

var syncModes = []filewritev1.SyncMode{filewritev1.SyncMode_SYNC_MODE_DATA, filewritev1.SyncMode_SYNC_MODE_FULL}

// fallocateModes are the modes a soak client's Fallocate picks from.
var fallocateModes = []filewritev1.FallocateMode{
	filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, filewritev1.FallocateMode_FALLOCATE_MODE_KEEP_SIZE,
	filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE,
}

// step performs one random operation of a slot owner.
func (c *soakClient) slotStep(ctx context.Context) {
	f, model := c.file, c.file.slots[c.slot]
	base := int64(c.slot) * soakSlot
	switch p := c.rng.IntN(100); {
	case p < 45: // Write, now and then synced
		off, n := c.randRange(soakSlot)
		data := c.randomData(n)
		sync := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
		op := "write"
		if p < 5 {
			sync, op = syncModes[p%2], "write-sync"
		}
		t0 := time.Now()
		resp, err := c.c.Write(ctx, &filewritev1.WriteRequest{Path: f.path, Offset: base + off, Data: data, Sync: sync})
		if c.record(op, t0, err) {
			copy(model[off:], data)
			if resp.GetBytesWritten() != n || resp.GetSize() < f.base() {
				c.unexpected(op, "wrote %d of %d bytes, size %d below the slots' end %d", resp.GetBytesWritten(), n, resp.GetSize(), f.base())
			}
		}
	case p < 70: // Read, checked against the model
		off, n := c.randRange(soakSlot)
		t0 := time.Now()
		resp, err := c.c.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: base + off, Length: n})
		if c.record("read", t0, err) && !bytes.Equal(resp.GetData(), model[off:off+n]) {
			c.unexpected("read", "[%d, +%d) differs from the model (%d bytes back)", base+off, n, len(resp.GetData()))
		}
	case p < 82: // Fallocate inside the slot: never changes the size
		off, n := c.randRange(soakSlot)
		mode := fallocateModes[c.rng.IntN(len(fallocateModes))]
		t0 := time.Now()
		resp, err := c.c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: f.path, Mode: mode, Offset: base + off, Length: n})
		if c.record("fallocate", t0, err) {
			if mode == filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE || mode == filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE {
				zero(model[off : off+n])
			}
			if resp.GetSize() < f.base() {
				c.unexpected("fallocate", "size %d below the slots' end %d", resp.GetSize(), f.base())
			}
		}
	case p < 94:
		t0 := time.Now()
		_, err := c.c.Fsync(ctx, &filewritev1.FsyncRequest{Path: f.path, DataOnly: c.rng.IntN(2) == 0})
		c.record("fsync", t0, err)
	default:
		c.badRequest(ctx)
	}
}

// badRequest sends a request that must fail with a known code and change
// nothing; whether it changed nothing is what the model checks.
func (c *soakClient) badRequest(ctx context.Context) {
	var err error
	var want codes.Code
	var reason filewritev1.ErrorReason
	t0 := time.Now()
	switch k := c.rng.IntN(4); {
	case k == 0:
		_, err = c.c.Read(ctx, &filewritev1.ReadRequest{Path: fmt.Sprintf("soak/missing-%d", c.id), Length: 10})
		want, reason = codes.NotFound, filewritev1.ErrorReason_FILE_NOT_FOUND
	case k == 1:
		_, err = c.c.Write(ctx, &filewritev1.WriteRequest{Path: "soak/../../escape", Data: []byte("x")})
		want, reason = codes.InvalidArgument, filewritev1.ErrorReason_PATH_INVALID
	case k == 2:
		_, err = c.c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: c.file.path, Offset: 0, Length: 4096})
		want, reason = codes.InvalidArgument, filewritev1.ErrorReason_MODE_INVALID // no mode
	case c.ownDaemon:
		_, err = c.c.Write(ctx, &filewritev1.WriteRequest{Path: c.file.path, Offset: soakMaxFileSize - 100, Data: c.randomData(4096)})
		want, reason = codes.OutOfRange, filewritev1.ErrorReason_FILE_TOO_LARGE // no retry makes it fit
	default:
		_, err = c.c.Truncate(ctx, &filewritev1.TruncateRequest{Path: c.file.path, Size: -1})
		want, reason = codes.InvalidArgument, filewritev1.ErrorReason_RANGE_INVALID
	}
	if got, gotReason := status.Code(err), client.Reason(err); got != want || gotReason != reason.String() {
		c.unexpected("bad-request", "got %v %s (%v), want %v %s", got, gotReason, err, want, reason)
		return
	}
	c.lat["bad-request"] = append(c.lat["bad-request"], time.Since(t0))
	c.expErr["bad-request"]++
}

// tailStep performs one random operation of the tail owner, the only client
// that changes its file's size.
func (c *soakClient) tailStep(ctx context.Context) {
	f := c.file
	base := f.base()
	checkSize := func(op string, got int64) {
		if got != f.size() {
			c.unexpected(op, "size %d, model %d", got, f.size())
		}
	}
	grow := func(end int64) {
		if end > int64(len(f.tail)) {
			f.tail = append(f.tail, make([]byte, end-int64(len(f.tail)))...)
		}
	}
	switch p := c.rng.IntN(100); {
	case p < 35: // Write anywhere in the tail: extending or not
		off, n := c.randRange(soakTailMax)
		data := c.randomData(n)
		t0 := time.Now()
		resp, err := c.c.Write(ctx, &filewritev1.WriteRequest{Path: f.path, Offset: base + off, Data: data})
		if c.record("write", t0, err) {
			grow(off + n)
			copy(f.tail[off:], data)
			checkSize("write", resp.GetSize())
		}
	case p < 50:
		size := c.rng.Int64N(soakTailMax + 1)
		t0 := time.Now()
		_, err := c.c.Truncate(ctx, &filewritev1.TruncateRequest{Path: f.path, Size: base + size})
		if c.record("truncate", t0, err) {
			if size < int64(len(f.tail)) {
				f.tail = f.tail[:size]
			}
			grow(size)
		}
	case p < 65: // Fallocate in the tail, past EOF too
		off, n := c.randRange(soakTailMax)
		mode := fallocateModes[c.rng.IntN(len(fallocateModes))]
		t0 := time.Now()
		resp, err := c.c.Fallocate(ctx, &filewritev1.FallocateRequest{Path: f.path, Mode: mode, Offset: base + off, Length: n})
		if c.record("fallocate", t0, err) {
			switch mode {
			case filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE:
				grow(off + n)
			case filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE:
				if off < int64(len(f.tail)) {
					zero(f.tail[off:min(off+n, int64(len(f.tail)))])
				}
			}
			checkSize("fallocate", resp.GetSize())
		}
	case p < 85: // Read, past EOF too: short reads must be exact
		off, n := c.randRange(soakTailMax)
		t0 := time.Now()
		resp, err := c.c.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: base + off, Length: n})
		if c.record("read", t0, err) {
			var want []byte
			if off < int64(len(f.tail)) {
				want = f.tail[off:min(off+n, int64(len(f.tail)))]
			}
			if !bytes.Equal(resp.GetData(), want) {
				c.unexpected("read", "[%d, +%d) differs from the model (%d bytes back, %d expected)", base+off, n, len(resp.GetData()), len(want))
			}
		}
	case p < 95:
		t0 := time.Now()
		resp, err := c.c.Stat(ctx, &filewritev1.StatRequest{Path: f.path})
		if c.record("stat", t0, err) {
			checkSize("stat", resp.GetSize())
		}
	default:
		t0 := time.Now()
		_, err := c.c.Fsync(ctx, &filewritev1.FsyncRequest{Path: f.path, DataOnly: c.rng.IntN(2) == 0})
		c.record("fsync", t0, err)
	}
}

// verifySoakFile compares the whole file with its model.
func verifySoakFile(ctx context.Context, c filewritev1.FileServiceClient, f *soakFile) error {
	st, err := c.Stat(ctx, &filewritev1.StatRequest{Path: f.path})
	if err != nil {
		return fmt.Errorf("final Stat %s: %w", f.path, err)
	}
	if st.GetSize() != f.size() {
		return fmt.Errorf("final size of %s is %d, the model's %d", f.path, st.GetSize(), f.size())
	}
	want := slices.Concat(append(slices.Clone(f.slots), f.tail)...)
	const chunk = 1 << 20
	for off := int64(0); off < int64(len(want)); off += chunk {
		n := min(chunk, int64(len(want))-off)
		resp, err := c.Read(ctx, &filewritev1.ReadRequest{Path: f.path, Offset: off, Length: n})
		if err != nil {
			return fmt.Errorf("final Read %s: %w", f.path, err)
		}
		if got := resp.GetData(); !bytes.Equal(got, want[off:off+n]) {
			i := 0
			for i < len(got) && i < int(n) && got[i] == want[off+int64(i)] {
				i++
			}
			return fmt.Errorf("final content of %s differs from the model at byte %d", f.path, off+int64(i))
		}
	}
	return nil
}

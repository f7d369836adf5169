//go:build linux

package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestAIORingWrites: writes through an O_DIRECT|O_DSYNC descriptor of an
// OSFS go through its ring, many at once, and land as pwrite(2) would put
// them: every block reads back what its last write wrote, short and
// failed writes report as pwrite's do, and no reaper is left once the
// writes are done.
func TestAIORingWrites(t *testing.T) {
	dir := testutil.Dir(t)
	fsys, err := OpenOSFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	const bs, blocks, writers = 4096, 64, 16
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, bs*blocks), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := fsys.OpenFile("f", openFlags|syscall.O_DIRECT|syscall.O_DSYNC, 0)
	if err != nil {
		t.Skipf("no O_DIRECT here: %v", err)
	}
	defer f.Close()
	if f.(*osFile).ring == nil {
		t.Skip("the kernel gives no AIO ring here: writes are pwrite(2)")
	}
	// Each writer owns the blocks i%writers == w and writes each twice,
	// the second time with its final contents.
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			buf := getAligned(bs, bs)
			defer putAligned(buf)
			for round := range 2 {
				for b := w; b < blocks; b += writers {
					copy(buf.b, bytes.Repeat([]byte{byte(b + round)}, bs))
					if n, err := f.WriteAt(buf.b, int64(b*bs)); n != bs || err != nil {
						errs <- fmt.Errorf("WriteAt block %d: got %d, %v; want %d, nil", b, n, err, bs)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	for b := range blocks {
		if want := bytes.Repeat([]byte{byte(b + 1)}, bs); !bytes.Equal(got[b*bs:(b+1)*bs], want) {
			t.Errorf("block %d: got %x..., want %x...", b, got[b*bs:b*bs+4], want[:4])
		}
	}
	// An unaligned buffer is refused by O_DIRECT: EINVAL, as pwrite(2)
	// reports it, nothing written.
	buf := getAligned(2*bs, bs)
	defer putAligned(buf)
	if n, err := f.WriteAt(buf.b[1:bs+1], 0); n != 0 || !errorsIsErrno(err, syscall.EINVAL) {
		t.Errorf("unaligned WriteAt: got %d, %v; want 0, EINVAL", n, err)
	}
	r := fsys.ring
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight != 0 {
		t.Errorf("in flight after every write returned: got %d, want 0", r.inflight)
	}
}

func errorsIsErrno(err error, want syscall.Errno) bool {
	pe, ok := err.(*os.PathError)
	return ok && pe.Err == want
}

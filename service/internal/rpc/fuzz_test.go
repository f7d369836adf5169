package rpc

import (
	"bytes"
	"context"
	"math"
	"os"
	"path"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// Limits of the store the fuzz targets run against.
const (
	fuzzMaxFileSize     = 1 << 20
	fuzzMaxRequestBytes = 64 << 10
	fuzzExisting        = "original contents"
)

// fuzzFixture is a fresh root for one fuzz input: a file, a directory and
// symlinks leading out of the root to a directory no request may touch,
// served by the FileService handlers over a new store. A fresh one per
// input keeps inputs independent and the store's view of the files true.
type fuzzFixture struct {
	dir, root string
	files     *FileServer
}

func newFuzzFixture(t *testing.T, parent string) *fuzzFixture {
	dir, err := os.MkdirTemp(parent, "input-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, err := range []error{
		os.Mkdir(root, 0o755),
		os.Mkdir(outside, 0o755),
		os.WriteFile(filepath.Join(root, "existing.bin"), []byte(fuzzExisting), 0o644),
		os.Mkdir(filepath.Join(root, "dir"), 0o755),
		os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644),
		os.Symlink("../outside", filepath.Join(root, "escape-dir")),
		os.Symlink("../outside/secret", filepath.Join(root, "escape-file")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	fsys, err := store.OpenOSFS(root)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(fsys, store.Options{MaxFileSize: fuzzMaxFileSize, MaxRequestBytes: fuzzMaxRequestBytes, MaxWaitersPerFile: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &fuzzFixture{dir: dir, root: root, files: &FileServer{store: st}}
}

// check holds every request to the same rules: the code is one a bad
// request may get (never INTERNAL: bad input is not a server fault); a
// refused request changed nothing; nothing outside the root ever changes.
// It returns the file's contents before the request when it succeeded.
func (fx *fuzzFixture) check(t *testing.T, what, name string, call func() error) (before []byte, ok bool) {
	t.Helper()
	snap := testutil.Snapshot(t, fx.dir)
	before = snap[filepath.Join("root", filepath.FromSlash(name))].Data
	err := call()
	switch code := status.Code(err); code {
	case codes.OK:
	case codes.InvalidArgument, codes.OutOfRange, codes.ResourceExhausted, codes.NotFound, codes.FailedPrecondition:
		testutil.CheckUnchanged(t, fx.dir, snap)
		return nil, false
	default:
		t.Fatalf("%s: %v, want OK or a refusal", what, err)
	}
	for rel, e := range testutil.Snapshot(t, filepath.Join(fx.dir, "outside")) {
		if was := snap[filepath.Join("outside", rel)]; !bytes.Equal(e.Data, was.Data) || e.Mode != was.Mode {
			t.Fatalf("%s changed outside/%s", what, rel)
		}
	}
	return before, true
}

// FuzzWriteRequest sends arbitrary Write requests through the handler.
// Accepted writes must have put the data at the offset of the file the
// path names; refused ones must have changed nothing.
func FuzzWriteRequest(f *testing.F) {
	f.Add("existing.bin", int64(0), []byte("x"), int32(0))
	f.Add("new/dir/file.bin", int64(4096), []byte("data"), int32(1))
	f.Add("existing.bin", int64(fuzzMaxFileSize-1), []byte("ab"), int32(2))
	f.Add("existing.bin", int64(-1), []byte("x"), int32(0))
	f.Add("existing.bin", int64(math.MaxInt64), []byte("x"), int32(0))
	f.Add("existing.bin", int64(0), []byte("x"), int32(3))
	f.Add("existing.bin", int64(0), []byte("x"), int32(-1))
	f.Add("../outside/secret", int64(0), []byte("x"), int32(0))
	f.Add("escape-file", int64(0), []byte("x"), int32(0))
	f.Add("escape-dir/new", int64(0), []byte("x"), int32(0))
	f.Add("dir", int64(0), []byte("x"), int32(0))
	f.Add("dir/../existing.bin", int64(0), []byte("x"), int32(0))
	f.Add("/abs", int64(0), []byte("x"), int32(0))
	f.Add("", int64(0), []byte{}, int32(0))
	f.Add("existing.bin/child", int64(0), []byte("x"), int32(0))
	f.Add(string(bytes.Repeat([]byte("n"), 300)), int64(0), []byte("x"), int32(0))
	f.Add("a\x00b", int64(0), []byte("x"), int32(0))
	f.Add("empty.bin", int64(10), []byte{}, int32(0))
	parent := testutil.Dir(f)
	f.Fuzz(func(t *testing.T, name string, off int64, data []byte, sync int32) {
		fx := newFuzzFixture(t, parent)
		req := &filewritev1.WriteRequest{Path: name, Offset: off, Data: data, Sync: filewritev1.SyncMode(sync)}
		var resp *filewritev1.WriteResponse
		before, ok := fx.check(t, "Write", name, func() (err error) {
			resp, err = fx.files.Write(context.Background(), req)
			return err
		})
		if !ok {
			return
		}
		got, err := os.ReadFile(filepath.Join(fx.root, filepath.FromSlash(path.Clean(name))))
		if err != nil {
			t.Fatalf("accepted Write of %q: %v", name, err)
		}
		wantSize := max(int64(len(before)), off+int64(len(data)))
		if len(data) == 0 {
			wantSize = int64(len(before))
		}
		if int64(len(got)) != wantSize || resp.GetSize() != wantSize {
			t.Fatalf("accepted Write of %d bytes at %d into %d bytes: file %d bytes, reply %d; want %d",
				len(data), off, len(before), len(got), resp.GetSize(), wantSize)
		}
		if len(data) > 0 && !bytes.Equal(got[off:off+int64(len(data))], data) {
			t.Fatalf("accepted Write: the file does not hold the data at %d", off)
		}
		if n := min(int64(len(before)), off); !bytes.Equal(got[:n], before[:n]) {
			t.Fatal("accepted Write changed bytes before its offset")
		}
	})
}

// FuzzFallocateRequest sends arbitrary Fallocate requests through the
// handler and checks accepted ones against a model of the file's bytes.
func FuzzFallocateRequest(f *testing.F) {
	for _, m := range []int32{0, 1, 2, 3, 4, 5, -1} {
		f.Add("existing.bin", m, int64(2), int64(5))
	}
	f.Add("new.bin", int32(1), int64(0), int64(fuzzMaxFileSize))
	f.Add("new.bin", int32(1), int64(1), int64(fuzzMaxFileSize))
	f.Add("existing.bin", int32(3), int64(0), int64(0))
	f.Add("existing.bin", int32(3), int64(-4096), int64(8192))
	f.Add("existing.bin", int32(4), int64(math.MaxInt64), int64(1))
	f.Add("escape-file", int32(3), int64(0), int64(4096))
	f.Add("dir", int32(1), int64(0), int64(10))
	f.Add("../outside/secret", int32(3), int64(0), int64(4096))
	parent := testutil.Dir(f)
	f.Fuzz(func(t *testing.T, name string, mode int32, off, length int64) {
		fx := newFuzzFixture(t, parent)
		req := &filewritev1.FallocateRequest{Path: name, Mode: filewritev1.FallocateMode(mode), Offset: off, Length: length}
		var resp *filewritev1.FallocateResponse
		before, ok := fx.check(t, "Fallocate", name, func() (err error) {
			resp, err = fx.files.Fallocate(context.Background(), req)
			return err
		})
		if !ok {
			return
		}
		got, err := os.ReadFile(filepath.Join(fx.root, filepath.FromSlash(path.Clean(name))))
		if err != nil {
			t.Fatalf("accepted Fallocate of %q: %v", name, err)
		}
		want := bytes.Clone(before)
		switch req.Mode {
		case filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE:
			if end := off + length; end > int64(len(want)) {
				want = append(want, make([]byte, end-int64(len(want)))...)
			}
		case filewritev1.FallocateMode_FALLOCATE_MODE_PUNCH_HOLE, filewritev1.FallocateMode_FALLOCATE_MODE_ZERO_RANGE:
			for i := off; i < min(off+length, int64(len(want))); i++ {
				want[i] = 0
			}
		}
		if !bytes.Equal(got, want) || resp.GetSize() != int64(len(want)) {
			t.Fatalf("accepted Fallocate %v [%d, +%d) of %d bytes: file %d bytes, reply size %d; want %d bytes as modelled",
				req.Mode, off, length, len(before), len(got), resp.GetSize(), len(want))
		}
	})
}

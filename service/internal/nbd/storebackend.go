//go:build linux

package nbd

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/filewrite/filewrite/store"
)

// StoreBackend serves a store's files as exports: an export's name is the
// file's path under the store's root, as on every other door, and each
// request is the store call that the gRPC handler of the same operation
// makes:
//
//	NBD_CMD_READ          Read
//	NBD_CMD_WRITE         Handle.Write (NBD_CMD_FLAG_FUA: SyncData, through the group commit)
//	NBD_CMD_FLUSH         Fsync(SyncData)
//	NBD_CMD_TRIM          Fallocate(PunchHole)
//	NBD_CMD_WRITE_ZEROES  Fallocate(PunchHole), or ZeroRange with NBD_CMD_FLAG_NO_HOLE
//	NBD_CMD_BLOCK_STATUS  ExtentsPage
//
// A missing file is no export: NBD creates nothing. The export's size is
// the file's when it opens, and stays what the client was told: a write
// within it is made where the client asked, even if another door shrank
// the file meanwhile (the file grows back to hold it), and a read past
// the file's end reads zeros.
type StoreBackend struct {
	Store *store.Store
	// Authorize decides what p may do with the file name: an error (that
	// wraps ErrPermission) refuses it, readOnly serves it read-only. nil
	// lets every client read and write every file.
	Authorize func(ctx context.Context, p *Peer, name string) (readOnly bool, err error)
	// Lists decides whether NBD_OPT_LIST names the file name to p, asked
	// for each file it finds; nil: whether Authorize lets p open it.
	Lists func(ctx context.Context, p *Peer, name string) bool
}

var _ Backend = (*StoreBackend)(nil)

// maxListRead bounds the directory entries one NBD_OPT_LIST reads, files
// and directories, whatever it finds: the list stops there.
const maxListRead = 10000

// Open opens the file name as an export.
func (b *StoreBackend) Open(ctx context.Context, p *Peer, name string) (Export, error) {
	readOnly := false
	if b.Authorize != nil {
		ro, err := b.Authorize(ctx, p, name)
		if err != nil {
			return nil, err
		}
		readOnly = ro
	}
	e := &storeExport{s: b.Store, name: name, readOnly: readOnly}
	if readOnly {
		st, err := b.Store.Stat(ctx, name)
		if err != nil {
			return nil, openError(name, err)
		}
		e.size = st.Size
		return e, nil
	}
	h, err := b.Store.OpenHandle(ctx, name, store.OpenMustExist)
	if err != nil {
		return nil, openError(name, err)
	}
	e.h, e.size = h, h.Size()
	return e, nil
}

// openError is what a client is told of a file that cannot be opened.
func openError(name string, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrIsDirectory), errors.Is(err, store.ErrNotRegular),
		errors.Is(err, store.ErrInvalidPath), errors.Is(err, store.ErrPathTooLong), errors.Is(err, store.ErrPathEscapes):
		return fmt.Errorf("%w: %q: %w", ErrNotFound, name, err)
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("%w: %w", ErrShutdown, err)
	}
	return err
}

// List returns the files under the root, depth first in name order, that
// Lists lets p see: at most limit of them, from at most maxListRead
// directory entries read.
func (b *StoreBackend) List(ctx context.Context, p *Peer, limit int) ([]string, error) {
	var names []string
	read := 0
	var walk func(dir string) error
	walk = func(dir string) error {
		token := ""
		for {
			ents, next, err := b.Store.List(ctx, dir, 0, token)
			if err != nil {
				if errors.Is(err, store.ErrClosed) {
					return fmt.Errorf("%w: %w", ErrShutdown, err)
				}
				return nil // gone, or unreadable: skipped
			}
			for _, e := range ents {
				if read++; read > maxListRead || len(names) >= limit {
					return nil
				}
				name := e.Name
				if dir != "" {
					name = path.Join(dir, e.Name)
				}
				if e.IsDir {
					if err := walk(name); err != nil {
						return err
					}
					continue
				}
				if b.lists(ctx, p, name) {
					names = append(names, name)
				}
			}
			if next == "" {
				return nil
			}
			token = next
		}
	}
	if err := walk(""); err != nil {
		return nil, err
	}
	return names, nil
}

// lists is Lists, or what stands for it.
func (b *StoreBackend) lists(ctx context.Context, p *Peer, name string) bool {
	switch {
	case b.Lists != nil:
		return b.Lists(ctx, p, name)
	case b.Authorize != nil:
		_, err := b.Authorize(ctx, p, name)
		return err == nil
	}
	return true
}

// storeExport is an open file. Writes go through the Handle opened with
// it, which follows the file; the other requests name the path.
type storeExport struct {
	s        *store.Store
	name     string
	size     int64
	readOnly bool
	h        *store.Handle // nil when read-only
}

var (
	_ Export    = (*storeExport)(nil)
	_ TryWriter = (*storeExport)(nil)
)

func (e *storeExport) Size() int64    { return e.size }
func (e *storeExport) ReadOnly() bool { return e.readOnly }

// readChunk bounds each Read that ReadAt makes: the store returns a
// buffer of its own, which is copied into the server's, and a READ of 32
// MiB would otherwise hold twice that.
const readChunk = 1 << 20

func (e *storeExport) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		want := min(len(p)-n, readChunk)
		data, err := e.s.Read(ctx, e.name, off+int64(n), int64(want))
		if err != nil {
			return n, requestError(err)
		}
		n += copy(p[n:], data)
		if len(data) < want {
			break // the file ends here
		}
	}
	return n, nil
}

func (e *storeExport) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	sync := store.SyncNone
	if fua {
		sync = store.SyncData
	}
	w, err := e.h.Write(ctx, off, p, sync)
	if err == nil {
		err = e.h.Wait(ctx, w)
	}
	return requestError(err)
}

func (e *storeExport) TryWriteAt(ctx context.Context, p []byte, off int64) bool {
	_, ok := e.h.TryWrite(ctx, off, p)
	return ok
}

func (e *storeExport) Flush(ctx context.Context) error {
	return requestError(e.s.Fsync(ctx, e.name, store.SyncData))
}

// alive fails once the file the export writes was deleted: a request by
// path would otherwise create a new one.
func (e *storeExport) alive() error {
	if e.h == nil {
		return nil
	}
	select {
	case <-e.h.Gone():
		return fmt.Errorf("%q was deleted", e.name)
	default:
		return nil
	}
}

func (e *storeExport) Trim(ctx context.Context, off, length int64, fua bool) error {
	if err := e.alive(); err != nil {
		return err
	}
	_, err := e.s.Fallocate(ctx, e.name, store.FallocPunchHole, off, length)
	if errors.Is(err, store.ErrUnsupported) {
		// A trim is a hint the server "MAY" follow.
		return nil
	}
	if err == nil && fua {
		err = e.s.Fsync(ctx, e.name, store.SyncData)
	}
	return requestError(err)
}

// zeros is what Zero writes where the file system cannot zero a range.
var zeros = make([]byte, 1<<20)

func (e *storeExport) Zero(ctx context.Context, off, length int64, f ZeroFlags) error {
	if err := e.alive(); err != nil {
		return err
	}
	mode := store.FallocPunchHole
	if f.NoHole {
		mode = store.FallocZeroRange
	}
	_, err := e.s.Fallocate(ctx, e.name, mode, off, length)
	if errors.Is(err, store.ErrUnsupported) {
		if f.Fast {
			return fmt.Errorf("%w: the file system cannot zero a range without writing it", ErrNotSupported)
		}
		err = e.writeZeros(ctx, off, length)
	}
	if err == nil && f.FUA {
		err = e.s.Fsync(ctx, e.name, store.SyncData)
	}
	return requestError(err)
}

// writeZeros writes zeros over the range, a chunk at a time.
func (e *storeExport) writeZeros(ctx context.Context, off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeros)), e.s.Options().MaxRequestBytes)
		w, err := e.h.Write(ctx, off, zeros[:n], store.SyncNone)
		if err == nil {
			err = e.h.Wait(ctx, w)
		}
		if err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	return nil
}

func (e *storeExport) Extents(ctx context.Context, off, length int64, limit int) ([]Extent, error) {
	exts, more, err := e.s.ExtentsPage(ctx, e.name, off, length, limit)
	if err != nil {
		return nil, requestError(err)
	}
	out := make([]Extent, 0, len(exts)+1)
	pos := off
	for _, x := range exts {
		out = append(out, Extent{Offset: x.Offset, Length: x.Length,
			Hole: x.State == store.ExtentHole, Zero: x.State != store.ExtentWritten})
		pos = x.Offset + x.Length
	}
	if !more && pos < off+length && len(out) < limit {
		// Past the file's end (another door shrank it): no storage,
		// reads as zeros.
		out = append(out, Extent{Offset: pos, Length: off + length - pos, Hole: true, Zero: true})
	}
	return out, nil
}

func (e *storeExport) Close() error {
	if e.h != nil {
		e.h.Close()
	}
	return nil
}

// requestError is what a client is told of a store error.
func requestError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNoSpace), errors.Is(err, store.ErrFileTooLarge):
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	case errors.Is(err, store.ErrInvalidOffset), errors.Is(err, store.ErrRequestTooLarge):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("%w: %w", ErrShutdown, err)
	}
	return err
}

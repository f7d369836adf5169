package webdav

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	xwebdav "golang.org/x/net/webdav"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/store"
)

// davFS is x/net/webdav's FileSystem over the store. Names are WebDAV
// paths below Prefix ("/a/b"); each operation runs on the direct road as
// the call it stands for, and its errors are fsError's.
type davFS struct{ d *Door }

var _ xwebdav.FileSystem = (*davFS)(nil)

// maxTreeDepth bounds how deep DELETE and MOVE of a collection go.
const maxTreeDepth = 256

// The FileService methods the operations that have no RPC of their own
// are checked and logged as.
const (
	methodWrite  = filewritev1.FileService_Write_FullMethodName
	methodList   = filewritev1.FileService_List_FullMethodName
	methodDelete = filewritev1.FileService_Delete_FullMethodName
	methodRename = filewritev1.FileService_Rename_FullMethodName
	methodStat   = filewritev1.FileService_Stat_FullMethodName
)

// Mkdir is MKCOL: checked as a Write of the new collection.
func (f *davFS) Mkdir(ctx context.Context, name string, _ os.FileMode) error {
	p := clean(name)
	if p == "" {
		return &os.PathError{Op: "mkdir", Path: name, Err: os.ErrExist}
	}
	err := f.d.cfg.Files.Run(ctx, methodWrite, &filewritev1.WriteRequest{Path: p}, func(ctx context.Context) error {
		return f.d.cfg.Store.Mkdir(ctx, p)
	})
	if err == nil {
		delete(stateOf(ctx).stats, p)
	}
	return fsError(ctx, "mkdir", name, err)
}

// OpenFile opens a resource: with O_CREATE or O_TRUNC (PUT, the
// destination of a COPY, LOCK of a new name) a staged file that Close
// publishes at name; otherwise the file or collection name is.
func (f *davFS) OpenFile(ctx context.Context, name string, flag int, _ os.FileMode) (xwebdav.File, error) {
	p := clean(name)
	if flag&(os.O_CREATE|os.O_TRUNC) == 0 {
		fi, err := f.d.stat(ctx, p)
		if err != nil {
			return nil, err
		}
		return &resource{d: f.d, ctx: ctx, p: p, info: fi}, nil
	}
	if p == "" {
		return nil, f.d.refuse(ctx, 405, "open", name, "the root is a collection")
	}
	if fi, err := f.d.stat(ctx, p); err == nil && fi.IsDir() {
		return nil, f.d.refuse(ctx, 405, "open", name, "a collection cannot be written")
	}
	if parent := path.Dir(p); parent != "." {
		if fi, err := f.d.stat(ctx, parent); err != nil || !fi.IsDir() {
			// 409: RFC 4918, section 9.7.1.
			return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
		}
	}
	return f.d.create(ctx, p)
}

// RemoveAll is DELETE: a file's Delete, or a collection's files' and
// then, deepest first, its directories' (each checked as a Delete).
func (f *davFS) RemoveAll(ctx context.Context, name string) error {
	p := clean(name)
	if p == "" {
		return &os.PathError{Op: "remove", Path: name, Err: os.ErrPermission}
	}
	fi, err := f.d.stat(ctx, p)
	if err != nil {
		return err
	}
	defer f.d.forget(ctx, p)
	if !fi.IsDir() {
		_, err := f.d.cfg.Files.Delete(ctx, &filewritev1.DeleteRequest{Path: p, Sync: true, IfGenerationMatch: stateOf(ctx).ifGeneration})
		return fsError(ctx, "remove", name, err)
	}
	return f.d.removeTree(ctx, p, 0)
}

func (d *Door) removeTree(ctx context.Context, p string, depth int) error {
	if depth > maxTreeDepth {
		return fsError(ctx, "remove", p, fmt.Errorf("%w: collections nested deeper than %d", store.ErrInvalidPath, maxTreeDepth))
	}
	entries, err := d.listAll(ctx, p)
	if err != nil {
		return err
	}
	for _, e := range entries {
		child := path.Join(p, e.name)
		if e.IsDir() {
			err = d.removeTree(ctx, child, depth+1)
		} else {
			_, err = d.cfg.Files.Delete(ctx, &filewritev1.DeleteRequest{Path: child})
			err = fsError(ctx, "remove", child, err)
		}
		if err != nil {
			return err
		}
	}
	err = d.cfg.Files.Run(ctx, methodDelete, &filewritev1.DeleteRequest{Path: p}, func(ctx context.Context) error {
		return d.cfg.Store.RemoveDir(ctx, p, true)
	})
	return fsError(ctx, "remove", p, err)
}

// Rename is MOVE: a file's Rename (without creating parents: the new
// name's collection must exist), or a collection's files moved one by
// one into a collection made at the new name.
func (f *davFS) Rename(ctx context.Context, oldName, newName string) error {
	po, pn := clean(oldName), clean(newName)
	if po == "" || pn == "" || strings.HasPrefix(pn, po+"/") {
		return &os.PathError{Op: "rename", Path: oldName, Err: os.ErrPermission}
	}
	if parent := path.Dir(pn); parent != "." {
		if fi, err := f.d.stat(ctx, parent); err != nil || !fi.IsDir() {
			return &os.PathError{Op: "rename", Path: newName, Err: os.ErrNotExist}
		}
	}
	fi, err := f.d.stat(ctx, po)
	if err != nil {
		return err
	}
	defer f.d.forget(ctx, po)
	defer f.d.forget(ctx, pn)
	if !fi.IsDir() {
		_, err := f.d.cfg.Files.Rename(ctx, &filewritev1.RenameRequest{Path: po, NewPath: pn, Sync: true})
		return fsError(ctx, "rename", oldName, err)
	}
	return f.d.moveTree(ctx, po, pn, 0)
}

func (d *Door) moveTree(ctx context.Context, po, pn string, depth int) error {
	if depth > maxTreeDepth {
		return fsError(ctx, "rename", po, fmt.Errorf("%w: collections nested deeper than %d", store.ErrInvalidPath, maxTreeDepth))
	}
	err := d.cfg.Files.Run(ctx, methodRename, &filewritev1.RenameRequest{Path: po, NewPath: pn}, func(ctx context.Context) error {
		if err := d.cfg.Store.Mkdir(ctx, pn); err != nil {
			return err
		}
		props, err := d.cfg.Store.Attr(ctx, po, propsAttr)
		if err != nil || props == nil {
			return err
		}
		return d.cfg.Store.SetAttr(ctx, pn, propsAttr, props)
	})
	if err != nil {
		return fsError(ctx, "rename", po, err)
	}
	entries, err := d.listAll(ctx, po)
	if err != nil {
		return err
	}
	for _, e := range entries {
		from, to := path.Join(po, e.name), path.Join(pn, e.name)
		if e.IsDir() {
			err = d.moveTree(ctx, from, to, depth+1)
		} else {
			_, err = d.cfg.Files.Rename(ctx, &filewritev1.RenameRequest{Path: from, NewPath: to, Sync: true})
			err = fsError(ctx, "rename", from, err)
		}
		if err != nil {
			return err
		}
	}
	err = d.cfg.Files.Run(ctx, methodDelete, &filewritev1.DeleteRequest{Path: po}, func(ctx context.Context) error {
		return d.cfg.Store.RemoveDir(ctx, po, true)
	})
	return fsError(ctx, "rename", po, err)
}

// Stat describes a file or collection.
func (f *davFS) Stat(ctx context.Context, name string) (os.FileInfo, error) {
	fi, err := f.d.stat(ctx, clean(name))
	if err != nil {
		return nil, err
	}
	return fi, nil
}

// stat describes p: a file as Stat answers, a collection as the store's
// Dir (checked as a List of it); remembered for the rest of the request.
func (d *Door) stat(ctx context.Context, p string) (*fileInfo, error) {
	st := stateOf(ctx)
	if fi := st.stats[p]; fi != nil {
		return fi, nil
	}
	var fi *fileInfo
	if p != "" {
		resp, err := d.cfg.Files.Stat(ctx, &filewritev1.StatRequest{Path: p})
		if err == nil {
			fi = &fileInfo{name: path.Base(p), size: resp.GetSize(), modTime: resp.GetChangeTime().AsTime(),
				etag: resp.GetEtag(), contentType: resp.GetContentType()}
		} else if errorinfo.Reason(err) != filewritev1.ErrorReason_IS_A_DIRECTORY.String() {
			return nil, fsError(ctx, "stat", p, err)
		}
	}
	if fi == nil {
		err := d.cfg.Files.Run(ctx, methodList, &filewritev1.ListRequest{Path: p}, func(ctx context.Context) error {
			info, err := d.cfg.Store.Dir(ctx, p)
			fi = &fileInfo{name: path.Base("/" + p), dir: true, modTime: timeOf(info.ChangeTime)}
			return err
		})
		if err != nil {
			return nil, fsError(ctx, "stat", p, err)
		}
	}
	st.stats[p] = fi
	return fi, nil
}

// forget drops what the request remembers of p, which it changed.
func (d *Door) forget(ctx context.Context, p string) {
	st := stateOf(ctx)
	delete(st.stats, p)
	delete(st.listings, p)
	delete(st.listings, path.Dir(p))
}

// list lists collection p, at most Config.MaxListing entries
// (errTooMany past them); remembered for the rest of the request.
func (d *Door) list(ctx context.Context, p string) ([]*fileInfo, error) {
	st := stateOf(ctx)
	if l, ok := st.listings[p]; ok {
		return l, nil
	}
	l, err := d.listUpTo(ctx, p, d.cfg.MaxListing)
	if err != nil {
		return nil, err
	}
	st.listings[p] = l
	return l, nil
}

// listAll lists collection p whole, for DELETE and MOVE, which need every
// entry however many.
func (d *Door) listAll(ctx context.Context, p string) ([]*fileInfo, error) {
	return d.listUpTo(ctx, p, -1)
}

func (d *Door) listUpTo(ctx context.Context, p string, limit int) ([]*fileInfo, error) {
	var out []*fileInfo
	token := ""
	for {
		resp, err := d.cfg.Files.List(ctx, &filewritev1.ListRequest{Path: p, PageSize: int32(store.DefaultListPageSize), PageToken: token})
		if err != nil {
			return nil, fsError(ctx, "readdir", p, err)
		}
		for _, e := range resp.GetEntries() {
			out = append(out, &fileInfo{name: e.GetName(), dir: e.GetIsDir(), size: e.GetSize()})
		}
		if limit >= 0 && len(out) > limit {
			return nil, fmt.Errorf("%w: the collection %s has more than %d entries, the most a PROPFIND lists (list it with GET /v1/dirs/%s, which pages)", errTooMany, "/"+p, limit, p)
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// refuse is an error x/net/webdav answers with code.
func (d *Door) refuse(ctx context.Context, code int, op, name, why string) error {
	st := stateOf(ctx)
	st.failCode = code
	st.failure = fmt.Errorf("%w: %s %s: %s", store.ErrInvalidPath, op, name, why)
	return &os.PathError{Op: op, Path: name, Err: errors.New(why)}
}

// create opens a staged file for p, checked as a Write of p, holding a
// piece of the in-flight budget until it is closed.
func (d *Door) create(ctx context.Context, p string) (*upload, error) {
	var b [12]byte
	rand.Read(b[:])
	u := &upload{d: d, ctx: ctx, p: p, staged: "dav-" + hex.EncodeToString(b[:]), contentType: stateOf(ctx).contentType}
	err := d.cfg.Files.Run(ctx, methodWrite, &filewritev1.WriteRequest{Path: p}, func(ctx context.Context) error {
		if err := d.cfg.Budget.Acquire(ctx, d.pieceBytes); err != nil {
			return err
		}
		h, err := d.cfg.Store.OpenStaged(ctx, u.staged, store.OpenExclusive)
		if err != nil {
			d.cfg.Budget.Release(d.pieceBytes)
			return err
		}
		u.h = h
		return nil
	})
	if err != nil {
		return nil, fsError(ctx, "open", p, err)
	}
	return u, nil
}

// errNotWritable: a resource opened without O_CREATE takes no bytes.
var errNotWritable = errors.New("not opened for writing")

// errIsDir: a collection has no bytes.
var errIsDir = fs.ErrInvalid

var _ io.ReaderFrom = (*upload)(nil)

package webdav

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"os"
	"time"

	xwebdav "golang.org/x/net/webdav"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/local"
	"github.com/filewrite/filewrite/service/internal/media"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// fileInfo describes a file or collection as WebDAV shows it: its ETag
// and media type are those of the REST route.
type fileInfo struct {
	name        string
	size        int64
	dir         bool
	modTime     time.Time
	etag        string
	contentType string
	// etagOf, when set, finds the ETag once it exists: a PUT's, asked
	// for after the file is published.
	etagOf func(ctx context.Context) (string, error)
}

var (
	_ os.FileInfo          = (*fileInfo)(nil)
	_ xwebdav.ETager       = (*fileInfo)(nil)
	_ xwebdav.ContentTyper = (*fileInfo)(nil)
)

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.size }
func (fi *fileInfo) ModTime() time.Time { return fi.modTime }
func (fi *fileInfo) IsDir() bool        { return fi.dir }
func (fi *fileInfo) Sys() any           { return nil }
func (fi *fileInfo) Mode() os.FileMode {
	if fi.dir {
		return os.ModeDir | 0o755
	}
	return 0o644
}

// ETag is the file's ETag as a download answers it (its generation,
// status.ETag): a PUT through another door moves it at once.
func (fi *fileInfo) ETag(ctx context.Context) (string, error) {
	if fi.etagOf != nil {
		return fi.etagOf(ctx)
	}
	return fi.etag, nil
}

// ContentType is the type a download is served with.
func (fi *fileInfo) ContentType(context.Context) (string, error) {
	if fi.contentType == "" {
		return media.OctetStream, nil
	}
	return fi.contentType, nil
}

// resource is a file or collection that exists, opened to be read,
// listed or have its dead properties patched.
type resource struct {
	d    *Door
	ctx  context.Context
	p    string
	info *fileInfo
	// rd is the file's descriptor, opened by the first Read; off is
	// where the next Read starts.
	rd  *local.Reader
	off int64
	// pos is how much of the listing Readdir returned.
	pos int
}

var (
	_ xwebdav.File            = (*resource)(nil)
	_ xwebdav.DeadPropsHolder = (*resource)(nil)
)

func (r *resource) Stat() (os.FileInfo, error) { return r.info, nil }

func (r *resource) Write([]byte) (int, error) { return 0, errNotWritable }

func (r *resource) Close() error {
	if r.rd != nil {
		return r.rd.Close()
	}
	return nil
}

// Read reads the file from its own descriptor, opened (checked as a Read)
// on first use.
func (r *resource) Read(b []byte) (int, error) {
	if r.info.dir {
		return 0, errIsDir
	}
	if r.rd == nil {
		rd, err := r.d.cfg.Files.OpenReader(r.ctx, r.p)
		if err != nil {
			return 0, fsError(r.ctx, "read", r.p, err)
		}
		r.rd = rd
	}
	var n int
	var err error
	if r.rd.File != nil {
		n, err = r.rd.File.ReadAt(b, r.off)
	} else {
		n, err = (&rpcReader{ctx: r.ctx, d: r.d, p: r.p, size: r.info.size}).ReadAt(b, r.off)
	}
	r.off += int64(n)
	if n > 0 && errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

func (r *resource) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.info.size
	}
	if offset < 0 {
		return 0, os.ErrInvalid
	}
	r.off = offset
	return offset, nil
}

// Readdir lists the collection (at most Config.MaxListing entries).
func (r *resource) Readdir(count int) ([]os.FileInfo, error) {
	if !r.info.dir {
		return nil, errIsDir
	}
	l, err := r.d.list(r.ctx, r.p)
	if err != nil {
		return nil, err
	}
	rest := l[r.pos:]
	if count > 0 {
		if len(rest) == 0 {
			return nil, io.EOF
		}
		rest = rest[:min(count, len(rest))]
	}
	r.pos += len(rest)
	out := make([]os.FileInfo, len(rest))
	for i, fi := range rest {
		out[i] = fi
	}
	return out, nil
}

// propsAttr is the attribute (store.SetAttr) that keeps a resource's dead
// properties, as JSON.
const propsAttr = "dav.props"

// deadProp is one dead property as the attribute keeps it.
type deadProp struct {
	Space string `json:"ns,omitempty"`
	Local string `json:"name"`
	Lang  string `json:"lang,omitempty"`
	XML   string `json:"xml,omitempty"`
}

func decodeProps(b []byte) (map[xml.Name]xwebdav.Property, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var list []deadProp
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, err
	}
	m := make(map[xml.Name]xwebdav.Property, len(list))
	for _, p := range list {
		n := xml.Name{Space: p.Space, Local: p.Local}
		m[n] = xwebdav.Property{XMLName: n, Lang: p.Lang, InnerXML: []byte(p.XML)}
	}
	return m, nil
}

func encodeProps(m map[xml.Name]xwebdav.Property) []byte {
	if len(m) == 0 {
		return nil
	}
	list := make([]deadProp, 0, len(m))
	for n, p := range m {
		list = append(list, deadProp{Space: n.Space, Local: n.Local, Lang: p.Lang, XML: string(p.InnerXML)})
	}
	b, _ := json.Marshal(list)
	return b
}

// applyPatches applies PROPPATCH's set and remove instructions, in order,
// to m, and answers each property 200: all or nothing, as RFC 4918 asks;
// the caller keeps m only if it can.
func applyPatches(m map[xml.Name]xwebdav.Property, patches []xwebdav.Proppatch) (map[xml.Name]xwebdav.Property, xwebdav.Propstat) {
	if m == nil {
		m = map[xml.Name]xwebdav.Property{}
	}
	ok := xwebdav.Propstat{Status: http.StatusOK}
	for _, patch := range patches {
		for _, p := range patch.Props {
			ok.Props = append(ok.Props, xwebdav.Property{XMLName: p.XMLName})
			if patch.Remove {
				delete(m, p.XMLName)
			} else {
				m[p.XMLName] = p
			}
		}
	}
	return m, ok
}

// failedPatch answers every property of patches with code: none was kept.
func failedPatch(patches []xwebdav.Proppatch, code int) []xwebdav.Propstat {
	st := xwebdav.Propstat{Status: code}
	for _, patch := range patches {
		for _, p := range patch.Props {
			st.Props = append(st.Props, xwebdav.Property{XMLName: p.XMLName})
		}
	}
	return []xwebdav.Propstat{st}
}

// DeadProps reads the resource's dead properties, checked as a Stat (a
// List of a collection).
func (r *resource) DeadProps() (map[xml.Name]xwebdav.Property, error) {
	if r.p == "" {
		return nil, nil // the root keeps none: it is no file
	}
	var b []byte
	err := r.d.cfg.Files.Run(r.ctx, r.readMethod(), r.readRequest(), func(ctx context.Context) error {
		var err error
		b, err = r.d.cfg.Store.Attr(ctx, r.p, propsAttr)
		return err
	})
	if err != nil {
		return nil, fsError(r.ctx, "propfind", r.p, err)
	}
	m, err := decodeProps(b)
	if err != nil {
		r.d.log.Warn("webdav: dead properties that do not decode are ignored", "path", r.p, "error", err)
		return nil, nil
	}
	return m, nil
}

func (r *resource) readMethod() string {
	if r.info.dir {
		return methodList
	}
	return methodStat
}

func (r *resource) readRequest() any {
	if r.info.dir {
		return &filewritev1.ListRequest{Path: r.p}
	}
	return &filewritev1.StatRequest{Path: r.p}
}

// Patch changes the resource's dead properties, checked as a Write.
// Durable when PROPPATCH is answered: nothing, until the file is synced
// whole (an attribute is metadata).
func (r *resource) Patch(patches []xwebdav.Proppatch) ([]xwebdav.Propstat, error) {
	if r.p == "" {
		return failedPatch(patches, http.StatusForbidden), nil
	}
	var ok xwebdav.Propstat
	err := r.d.cfg.Files.Run(r.ctx, methodWrite, &filewritev1.WriteRequest{Path: r.p}, func(ctx context.Context) error {
		b, err := r.d.cfg.Store.Attr(ctx, r.p, propsAttr)
		if err != nil {
			return err
		}
		m, err := decodeProps(b)
		if err != nil {
			m = nil // replaced whole
		}
		m, ok = applyPatches(m, patches)
		return r.d.cfg.Store.SetAttr(ctx, r.p, propsAttr, encodeProps(m))
	})
	if err != nil {
		code, _ := failure(err)
		switch {
		case code == http.StatusForbidden || code == http.StatusUnauthorized:
			return failedPatch(patches, http.StatusForbidden), nil
		case code == http.StatusRequestEntityTooLarge || code == http.StatusBadRequest || code == http.StatusInsufficientStorage ||
			code == http.StatusPreconditionFailed:
			// More than the filesystem keeps with one file, or none
			// kept at all.
			return failedPatch(patches, http.StatusInsufficientStorage), nil
		}
		return nil, fsError(r.ctx, "proppatch", r.p, err)
	}
	return []xwebdav.Propstat{ok}, nil
}

// upload is a file being written by a PUT (or a COPY, or a LOCK of a new
// name) into a staged file, published at p by Close.
type upload struct {
	d           *Door
	ctx         context.Context
	p           string
	staged      string
	h           *store.Handle // nil once closed
	written     int64
	contentType string
	props       map[xml.Name]xwebdav.Property
	err         error // the first write's failure: Close publishes nothing
}

var (
	_ xwebdav.File            = (*upload)(nil)
	_ xwebdav.DeadPropsHolder = (*upload)(nil)
)

func (u *upload) Read([]byte) (int, error)       { return 0, io.EOF }
func (u *upload) Seek(int64, int) (int64, error) { return u.written, nil }
func (u *upload) Readdir(int) ([]os.FileInfo, error) {
	return nil, errIsDir
}

// Stat describes the file as it will be: its ETag is asked for once it is
// published (x/net/webdav answers a PUT's ETag after Close).
func (u *upload) Stat() (os.FileInfo, error) {
	return &fileInfo{name: u.p, size: u.written, modTime: time.Now(), contentType: u.contentType,
		etagOf: func(ctx context.Context) (string, error) {
			resp, err := u.d.cfg.Files.Stat(u.ctx, &filewritev1.StatRequest{Path: u.p})
			if err != nil {
				return "", nil // no ETag to give
			}
			return resp.GetEtag(), nil
		}}, nil
}

func (u *upload) Write(b []byte) (int, error) {
	if u.err != nil {
		return 0, u.err
	}
	if _, err := u.h.Write(u.ctx, u.written, b, store.SyncNone); err != nil {
		u.err = fsError(u.ctx, "write", u.p, err)
		return 0, u.err
	}
	u.written += int64(len(b))
	return len(b), nil
}

// ReadFrom takes a PUT's body in pieces of the door's piece size, or a
// COPY's source inside the kernel (store.Handle.CopyFrom, checked as a
// Read of the source), with its media type.
func (u *upload) ReadFrom(src io.Reader) (int64, error) {
	if u.err != nil {
		return 0, u.err
	}
	if r, ok := src.(*resource); ok && !r.info.dir {
		return u.copyFrom(r)
	}
	bp := u.d.pieces.Get().(*[]byte)
	defer u.d.pieces.Put(bp)
	buf := *bp
	var n int64
	for {
		m, rerr := io.ReadFull(src, buf)
		if m > 0 {
			if _, err := u.h.Write(u.ctx, u.written, buf[:m], store.SyncNone); err != nil {
				u.err = fsError(u.ctx, "write", u.p, err)
				return n, u.err
			}
			// The disk works while the next piece arrives.
			u.h.StartWriteBack(u.written, int64(m))
			u.written += int64(m)
			n += int64(m)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return n, nil
		}
		if rerr != nil {
			u.err = rerr
			return n, rerr
		}
	}
}

func (u *upload) copyFrom(r *resource) (int64, error) {
	var n int64
	err := u.d.cfg.Files.Run(u.ctx, filewritev1.FileService_Read_FullMethodName, &filewritev1.ReadRequest{Path: r.p}, func(ctx context.Context) error {
		src, err := u.d.cfg.Store.OpenHandle(ctx, r.p, store.OpenMustExist)
		if err != nil {
			return err
		}
		defer src.Close()
		n, err = u.h.CopyFrom(ctx, src, 0, u.written, src.Size())
		return err
	})
	u.written += n
	if err != nil {
		u.err = fsError(u.ctx, "copy", u.p, err)
		return n, u.err
	}
	if u.contentType == "" {
		u.contentType = r.info.contentType
	}
	return n, nil
}

func (u *upload) DeadProps() (map[xml.Name]xwebdav.Property, error) { return u.props, nil }

// Patch keeps dead properties for the file, set with it when it is
// published (a COPY's source's).
func (u *upload) Patch(patches []xwebdav.Proppatch) ([]xwebdav.Propstat, error) {
	var ok xwebdav.Propstat
	u.props, ok = applyPatches(u.props, patches)
	return []xwebdav.Propstat{ok}, nil
}

// Close publishes the file at p (store.Publish: synced, renamed, both
// directories synced), checked as a Rename onto p, with its media type
// and dead properties; or, after a failed write, removes it.
func (u *upload) Close() error {
	if u.h == nil {
		return nil
	}
	defer func() {
		u.h.Close()
		u.h = nil
		u.d.cfg.Budget.Release(u.d.pieceBytes)
		u.d.forget(u.ctx, u.p)
	}()
	if u.err != nil {
		u.d.cfg.Store.RemoveStaged(context.WithoutCancel(u.ctx), u.staged)
		return u.err
	}
	err := u.d.cfg.Files.Run(u.ctx, methodRename, &filewritev1.RenameRequest{Path: u.p, NewPath: u.p, Sync: true}, func(ctx context.Context) error {
		if u.contentType != "" {
			if err := u.h.SetAttr(store.AttrContentType, []byte(u.contentType)); err != nil && !errors.Is(err, store.ErrUnsupported) {
				return err
			}
		}
		if b := encodeProps(u.props); b != nil {
			if err := u.h.SetAttr(propsAttr, b); err != nil && !errors.Is(err, store.ErrUnsupported) {
				return err
			}
		}
		return u.d.cfg.Store.PublishIf(ctx, u.staged, u.p, false, status.Precondition(stateOf(u.ctx).ifGeneration, nil))
	})
	if err != nil {
		u.d.cfg.Store.RemoveStaged(context.WithoutCancel(u.ctx), u.staged)
		return fsError(u.ctx, "close", u.p, err)
	}
	return nil
}

// rpcReader reads a file through Read calls, where the store gives no
// descriptor of its own (a file layer of the tests').
type rpcReader struct {
	ctx  context.Context
	d    *Door
	p    string
	size int64
	off  int64
}

func (r *rpcReader) ReadAt(b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		chunk := min(int64(len(b)-n), r.d.pieceBytes)
		resp, err := r.d.cfg.Files.Read(r.ctx, &filewritev1.ReadRequest{Path: r.p, Offset: off + int64(n), Length: chunk})
		if err != nil {
			return n, err
		}
		n += copy(b[n:], resp.GetData())
		if int64(len(resp.GetData())) < chunk {
			return n, io.EOF
		}
	}
	return n, nil
}

func (r *rpcReader) Read(b []byte) (int, error) {
	n, err := r.ReadAt(b, r.off)
	r.off += int64(n)
	return n, err
}

func (r *rpcReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.size
	}
	r.off = offset
	return offset, nil
}

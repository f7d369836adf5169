package uploads

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	tusd "github.com/tus/tusd/v2/pkg/handler"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// record is what the door keeps of an upload beside its staged file
// (store.PutRecord), as JSON. It is written when the upload is created,
// when its length is declared, and when it completes; its offset is not
// in it: that is the staged file's size.
type record struct {
	ID       string            `json:"id"`
	Size     int64             `json:"size"`
	Deferred bool              `json:"deferred,omitempty"`
	Meta     map[string]string `json:"meta,omitempty"`
	// Target is the path the upload is published at; "" for a partial
	// upload, which is published only as part of a final one.
	Target string `json:"target,omitempty"`
	// Home is where a partial upload is checked for: the credential's
	// home when it was created (Config.Home).
	Home    string   `json:"home,omitempty"`
	Partial bool     `json:"partial,omitempty"`
	Final   bool     `json:"final,omitempty"`
	Parts   []string `json:"parts,omitempty"`
	// Owner is a digest of the creating credential's key (Config.Owner).
	Owner string `json:"owner,omitempty"`
	// Done is set, durably, before the upload is published: a done
	// upload whose staged file is still there (the daemon stopped in the
	// middle of its publish) is published again before anyone is told
	// of it.
	Done    bool      `json:"done,omitempty"`
	Created time.Time `json:"created"`
}

// checked is the path the upload's requests are checked against.
func (r *record) checked() string {
	if r.Partial {
		return r.Home
	}
	return r.Target
}

// stagedName is the staged file and the record of upload id.
func stagedName(id string) string { return "tus-" + id }

// idLen is the length of an upload ID: 16 random bytes in hex, which no
// client can guess.
const idLen = 32

func newID() string {
	var b [idLen / 2]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validID(id string) bool {
	if len(id) != idLen {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// ownerDigest is what a record keeps of a credential's key: a digest, so
// that the state directory holds nothing a token could be told from.
func ownerDigest(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("filewrite tus owner\x00" + key))
	return hex.EncodeToString(sum[:])
}

// dataStore is tusd's DataStore over the store: every tusd interface but
// ContentServer (downloads are the REST route's).
type dataStore struct{ d *Door }

var (
	_ tusd.DataStore               = dataStore{}
	_ tusd.TerminaterDataStore     = dataStore{}
	_ tusd.ConcaterDataStore       = dataStore{}
	_ tusd.LengthDeferrerDataStore = dataStore{}
)

// upload is one upload, as a request found it.
type upload struct {
	d   *Door
	rec *record
}

var (
	_ tusd.Upload                 = (*upload)(nil)
	_ tusd.TerminatableUpload     = (*upload)(nil)
	_ tusd.ConcatableUpload       = (*upload)(nil)
	_ tusd.LengthDeclarableUpload = (*upload)(nil)
)

func (ds dataStore) AsTerminatableUpload(u tusd.Upload) tusd.TerminatableUpload {
	return u.(*upload)
}
func (ds dataStore) AsConcatableUpload(u tusd.Upload) tusd.ConcatableUpload { return u.(*upload) }
func (ds dataStore) AsLengthDeclarableUpload(u tusd.Upload) tusd.LengthDeclarableUpload {
	return u.(*upload)
}

// NewUpload creates an upload: it finds the target in the metadata,
// checks that the caller may write it, and keeps the record and an empty
// staged file.
func (ds dataStore) NewUpload(ctx context.Context, info tusd.FileInfo) (tusd.Upload, error) {
	d := ds.d
	rec := &record{
		ID: newID(), Size: info.Size, Deferred: info.SizeIsDeferred, Meta: info.MetaData,
		Partial: info.IsPartial, Final: info.IsFinal, Parts: info.PartialUploads,
		Owner: ownerDigest(d.cfg.Owner(ctx)), Created: time.Now().UTC(),
	}
	if ct := rec.Meta["filetype"]; ct != "" {
		if _, err := store.CheckContentType(ct); err != nil {
			return nil, malformed("Upload-Metadata", "filetype: %v", err)
		}
	}
	home, err := d.cfg.Home(ctx)
	if err != nil {
		return nil, httpError(err)
	}
	if rec.Partial {
		rec.Home = home
	} else if rec.Target, err = target(rec.Meta, home); err != nil {
		return nil, err
	}
	err = d.cfg.Calls.Run(ctx, filewritev1.FileService_Write_FullMethodName, &filewritev1.WriteRequest{Path: rec.checked()}, func(ctx context.Context) error {
		if err := d.putRecord(rec); err != nil {
			return err
		}
		h, err := d.cfg.Store.OpenStaged(ctx, stagedName(rec.ID), store.OpenExclusive)
		if err != nil {
			d.cfg.Store.RemoveRecord(stagedName(rec.ID))
			return err
		}
		h.Close()
		return nil
	})
	if err != nil {
		return nil, httpError(err)
	}
	return &upload{d: d, rec: rec}, nil
}

// target is the path an upload is published at: the metadata's path, or
// its filename in home.
func target(meta map[string]string, home string) (string, error) {
	if p := meta["path"]; p != "" {
		if err := store.ValidatePath(p); err != nil {
			return "", httpError(status.Of(err))
		}
		return p, nil
	}
	name := meta["filename"]
	switch {
	case name == "":
		return "", malformed("Upload-Metadata", "name the file: path (relative to the root) or filename (placed in the credential's directory)")
	case strings.ContainsRune(name, '/') || name == "." || name == "..":
		return "", malformed("Upload-Metadata", "filename %q: want one name, without '/' (give path for a file in another directory)", name)
	}
	p := name
	if home != "" {
		p = path.Join(home, name)
	}
	if err := store.ValidatePath(p); err != nil {
		return "", httpError(status.Of(err))
	}
	return p, nil
}

// GetUpload finds upload id: 404 for an ID that was never given, has
// expired, or belongs to another credential. A HEAD is checked as a Stat
// of the target. A done upload whose publish the daemon did not finish is
// published now, before anyone learns that it is complete.
func (ds dataStore) GetUpload(ctx context.Context, id string) (tusd.Upload, error) {
	d := ds.d
	rec, err := d.getRecord(id)
	if err != nil {
		return nil, err
	}
	if rec.Owner != ownerDigest(d.cfg.Owner(ctx)) {
		return nil, tusd.ErrNotFound
	}
	u := &upload{d: d, rec: rec}
	if st := stateOf(ctx); st != nil && st.method == "HEAD" {
		err := d.cfg.Calls.Run(ctx, filewritev1.FileService_Stat_FullMethodName, &filewritev1.StatRequest{Path: rec.checked()}, func(context.Context) error { return nil })
		if err != nil {
			return nil, httpError(err)
		}
	}
	if rec.Done && !rec.Partial {
		if err := u.publish(ctx); err != nil {
			return nil, err
		}
	}
	return u, nil
}

func (d *Door) getRecord(id string) (*record, error) {
	if !validID(id) {
		return nil, tusd.ErrNotFound
	}
	b, err := d.cfg.Store.Record(stagedName(id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, tusd.ErrNotFound
	}
	if err != nil {
		return nil, httpError(status.Of(err))
	}
	rec := &record{}
	if err := json.Unmarshal(b, rec); err != nil || rec.ID != id {
		return nil, fmt.Errorf("upload %s: damaged record: %v", id, err)
	}
	return rec, nil
}

func (d *Door) putRecord(rec *record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return d.cfg.Store.PutRecord(stagedName(rec.ID), b)
}

// GetInfo says where the upload stands: its offset is its staged file's
// size, or its length once it is done.
func (u *upload) GetInfo(ctx context.Context) (tusd.FileInfo, error) {
	rec := u.rec
	info := tusd.FileInfo{
		ID: rec.ID, Size: rec.Size, SizeIsDeferred: rec.Deferred, MetaData: rec.Meta,
		IsPartial: rec.Partial, IsFinal: rec.Final, PartialUploads: rec.Parts,
	}
	if info.MetaData == nil {
		info.MetaData = tusd.MetaData{}
	}
	if rec.Done {
		info.Offset = rec.Size
		return info, nil
	}
	sf, err := u.d.cfg.Store.StatStaged(stagedName(rec.ID))
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Created, and the daemon stopped before the staged file was:
		// nothing of it was acknowledged.
	case err != nil:
		return info, httpError(status.Of(err))
	default:
		info.Offset = sf.Size
		if st := stateOf(ctx); st != nil {
			st.expires = u.d.expiresAt(sf.Ctime)
		}
	}
	return info, nil
}

// WriteChunk writes src at offset, checked, logged and traced as one
// Write of the target, in pieces of Config.PieceBytes held in the
// in-flight budget, and makes them durable (fdatasync) before it returns:
// tusd answers with the new Upload-Offset only then. With an
// Upload-Checksum (the thin layer's), the bytes are kept only if their
// checksum matches: otherwise the file is cut back to offset, and nothing
// of this PATCH counts.
func (u *upload) WriteChunk(ctx context.Context, offset int64, src io.Reader) (int64, error) {
	d, rec := u.d, u.rec
	if rec.Done {
		return 0, tusd.ErrModifyFinal
	}
	var written int64
	req := &filewritev1.WriteRequest{Path: rec.checked(), Offset: offset, Sync: filewritev1.SyncMode_SYNC_MODE_DATA}
	err := d.cfg.Calls.Run(ctx, filewritev1.FileService_Write_FullMethodName, req, func(ctx context.Context) error {
		if err := d.cfg.Budget.Acquire(ctx, d.pieceBytes); err != nil {
			return err
		}
		defer d.cfg.Budget.Release(d.pieceBytes)
		h, err := d.cfg.Store.OpenStaged(ctx, stagedName(rec.ID), store.OpenCreate)
		if err != nil {
			return err
		}
		defer h.Close()
		if h.Size() != offset {
			// tusd compared offset with GetInfo's under the upload's lock.
			return fmt.Errorf("%w: upload %s is at %d, not %d", store.ErrInvalidOffset, rec.ID, h.Size(), offset)
		}
		st := stateOf(ctx)
		sum := st.checksum()
		buf := d.getPiece()
		defer d.putPiece(buf)
		var werr error
		for werr == nil {
			n, rerr := io.ReadFull(src, buf)
			if n > 0 {
				if sum != nil {
					sum.Write(buf[:n])
				}
				_, werr = h.Write(ctx, offset+written, buf[:n], store.SyncNone)
				if werr == nil {
					written += int64(n)
					// The disk works while the next piece arrives: the
					// sync at the PATCH's end finds little left.
					werr = h.StartWriteBack(offset+written-int64(n), int64(n))
				}
			}
			if rerr != nil {
				break // the body's end, or its failure: tusd reports it
			}
		}
		if werr == nil && sum != nil && !st.sumMatches(sum) {
			werr = errChecksumMismatch
		}
		if werr != nil && (errors.Is(werr, errChecksumMismatch) || sum != nil) {
			// Nothing of a PATCH whose checksum cannot be verified counts.
			if terr := h.Truncate(context.WithoutCancel(ctx), offset); terr != nil {
				return terr
			}
			written = 0
			return werr
		}
		if werr != nil {
			// Part of the failed piece may have reached the file: the
			// file's size is the offset a HEAD will tell.
			written = h.Size() - offset
		}
		// Durable before tusd answers the new offset, also when the body
		// broke midway: what reached the file is the upload's now.
		if serr := h.Sync(context.WithoutCancel(ctx), store.SyncData); serr != nil && werr == nil {
			werr = serr
		}
		if st != nil {
			st.expires = d.expiresAt(time.Now().UnixNano())
		}
		return werr
	})
	if err != nil {
		return written, httpError(err)
	}
	return written, nil
}

// FinishUpload publishes a complete upload at its target: a partial one
// waits for its final upload.
func (u *upload) FinishUpload(ctx context.Context) error {
	if u.rec.Partial {
		return nil
	}
	u.rec.Done = true
	if err := u.d.putRecord(u.rec); err != nil {
		return httpError(status.Of(err))
	}
	return u.publish(ctx)
}

// publish gives a done upload's staged file its target, with its media
// type, checked as a Rename onto the target. A staged file that is gone
// was published already.
func (u *upload) publish(ctx context.Context) error {
	d, rec := u.d, u.rec
	req := &filewritev1.RenameRequest{Path: rec.Target, NewPath: rec.Target, Sync: true}
	err := d.cfg.Calls.Run(ctx, filewritev1.FileService_Rename_FullMethodName, req, func(ctx context.Context) error {
		return d.publishStaged(ctx, rec)
	})
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			// Not done after all: the client may try again.
			rec.Done = false
			if perr := d.putRecord(rec); perr != nil {
				d.log.Error("tus: an upload that could not be published stays marked done", "id", rec.ID, "error", perr)
			}
		}
		return httpError(err)
	}
	return nil
}

// publishStaged gives a done upload's staged file, with its media type,
// its target; a staged file that is gone was published already.
func (d *Door) publishStaged(ctx context.Context, rec *record) error {
	name := stagedName(rec.ID)
	h, err := d.cfg.Store.OpenStaged(ctx, name, store.OpenMustExist)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	if h.Size() != rec.Size {
		return fmt.Errorf("upload %s: %d bytes staged for a length of %d", rec.ID, h.Size(), rec.Size)
	}
	if ct := rec.Meta["filetype"]; ct != "" {
		ct, _ = store.CheckContentType(ct)
		if err := h.SetAttr(store.AttrContentType, []byte(ct)); err != nil && !errors.Is(err, store.ErrUnsupported) {
			return err
		}
	}
	return d.cfg.Store.Publish(ctx, name, rec.Target, false)
}

// GetReader is never called: the door serves no downloads (tusd's GET is
// off), which are the REST route's.
func (u *upload) GetReader(ctx context.Context) (io.ReadCloser, error) {
	return nil, tusd.ErrNotImplemented
}

// Terminate removes the upload, checked as a Delete of the target: its
// staged bytes and its record. A done upload's published file stays.
func (u *upload) Terminate(ctx context.Context) error {
	d, rec := u.d, u.rec
	err := d.cfg.Calls.Run(ctx, filewritev1.FileService_Delete_FullMethodName, &filewritev1.DeleteRequest{Path: rec.checked()}, func(ctx context.Context) error {
		return d.remove(ctx, rec.ID)
	})
	if err != nil {
		return httpError(err)
	}
	return nil
}

// remove removes upload id's staged file and record.
func (d *Door) remove(ctx context.Context, id string) error {
	if err := d.cfg.Store.RemoveStaged(ctx, stagedName(id)); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return d.cfg.Store.RemoveRecord(stagedName(id))
}

// DeclareLength sets a deferred length (creation-defer-length).
func (u *upload) DeclareLength(ctx context.Context, length int64) error {
	u.rec.Size, u.rec.Deferred = length, false
	if err := u.d.putRecord(u.rec); err != nil {
		return httpError(status.Of(err))
	}
	return nil
}

// ConcatUploads assembles a final upload from its partial ones, in order,
// with copy_file_range (a reflink where the filesystem has them), and
// publishes it; the partial uploads are removed once it is published
// (tus lets the server do so).
func (u *upload) ConcatUploads(ctx context.Context, partials []tusd.Upload) error {
	d, rec := u.d, u.rec
	err := d.cfg.Calls.Run(ctx, filewritev1.FileService_Write_FullMethodName, &filewritev1.WriteRequest{Path: rec.Target, Sync: filewritev1.SyncMode_SYNC_MODE_FULL}, func(ctx context.Context) error {
		dst, err := d.cfg.Store.OpenStaged(ctx, stagedName(rec.ID), store.OpenMustExist)
		if err != nil {
			return err
		}
		defer dst.Close()
		var off int64
		for _, p := range partials {
			prec := p.(*upload).rec
			src, err := d.cfg.Store.OpenStaged(ctx, stagedName(prec.ID), store.OpenMustExist)
			if err != nil {
				return err
			}
			n, err := dst.CopyFrom(ctx, src, 0, off, prec.Size)
			src.Close()
			if err != nil {
				return err
			}
			if n != prec.Size {
				return fmt.Errorf("partial upload %s: %d bytes staged for a length of %d", prec.ID, n, prec.Size)
			}
			off += n
		}
		return nil
	})
	if err != nil {
		return httpError(err)
	}
	if err := u.FinishUpload(ctx); err != nil {
		return err
	}
	for _, p := range partials {
		if err := d.remove(ctx, p.(*upload).rec.ID); err != nil {
			d.log.Warn("tus: a partial upload was not removed after its concatenation; it expires", "id", p.(*upload).rec.ID, "error", err)
		}
	}
	return nil
}

// errChecksumMismatch: the PATCH's bytes did not match its Upload-Checksum.
var errChecksumMismatch = tusd.NewError("ERR_CHECKSUM_MISMATCH", "the bytes do not match Upload-Checksum: none of them were kept", 460)

// malformed is a 400 for a header the door cannot take.
func malformed(header, format string, a ...any) error {
	return httpError(status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: header}, format, a...))
}

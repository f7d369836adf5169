//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
)

// Files cut short from outside.
//
// The store keeps a file's size itself (inode.size) and trusts it: only
// the store changes the files it holds open. A file truncated from outside
// breaks that: the store's size says more than the file holds, reads come
// back short, and a write through the file's mapping past the new end,
// within the page that holds it, is acknowledged and lost (mapped.go). So
// the store looks at the file's length where it learns it anyway, and
// where the mapping gives a sign: the fstat(2) of every Stat and of every
// sync, a fault of a mapped store or of its probe, and the fstat of a file
// it closes for room. A length below the store's own is checked again
// with the lock held exclusively and no write in flight (checkCut), where
// no store operation can be changing it; confirmed, the store takes the
// file as it is and the call that found it fails with ErrChangedOutside.

// errCutSuspected says that a file may have been cut short from outside:
// a write's mapping faulted (writeData), or a sync's fstat found the file
// shorter than the store's size (syncFile, through the group commit to
// each caller of the batch). The one who meets it checks the file
// (checkCut) and reports ErrChangedOutside or nothing; it never reaches a
// caller of the store.
var errCutSuspected = errors.New("the file may have been cut short from outside")

// checkCut checks, with ino's lock held exclusively and no write in flight,
// whether ino's file is shorter than the store made it. If it is, the store
// takes the file's size and extents as they are now, unmaps the file's
// mapping and writes it with pwrite until it is opened again, and checkCut
// returns ErrChangedOutside; otherwise nil. held says that the caller holds
// the lock exclusively already.
func (s *Store) checkCut(ctx context.Context, ino *inode, held bool) error {
	if !held {
		h, err := lockInode(ctx, ino, lockExclusive, "check", ReasonChangedOutside)
		if err != nil {
			return err
		}
		defer func() {
			ino.lock.release(h)
			putHolder(h)
		}()
	}
	if err := waitInflight(ctx, ino, ReasonChangedOutside); err != nil {
		return err
	}
	if ino.deleted.Load() {
		return nil // no name reaches it: nothing to tell
	}
	fi, err := ino.file.Stat()
	if err != nil || fi.Size >= ino.size.Load() {
		return nil
	}
	cut := ino.cutError(fi.Size, "")
	ino.mapping.off.Store(true)
	ino.unmapAll()
	s.reloadExtents(ino)
	ino.bump()
	return cut
}

// cutError is ErrChangedOutside for ino's file found size bytes long,
// where, if not empty, says when it was found.
func (ino *inode) cutError(size int64, when string) error {
	if when != "" {
		when = " " + when
	}
	return fmt.Errorf("%w: %s is %d bytes long%s, %d fewer than the store made it: it was cut short from outside the store, and what was written past byte %d is gone",
		ErrChangedOutside, ino.path(), size, when, ino.size.Load()-size, size)
}

// cutReported reports, once, that ino's file was found shorter than the
// store made it when the table closed it for room (inode.cutPending): the
// next Stat or sync of it returns ErrChangedOutside.
func (ino *inode) cutReported() error {
	if !ino.cutPending.Load() || !ino.cutPending.Swap(false) {
		return nil
	}
	return fmt.Errorf("%w: %s was found shorter than the store made it when it was closed for lack of descriptors: it was cut short from outside the store, and what was written past its end then is gone",
		ErrChangedOutside, ino.path())
}

// syncChecked is the end of a sync of ino that returned err: a batch that
// found the file shorter than the store's size (errCutSuspected) is
// checked (checkCut), and a cut found at close is reported. held is
// checkCut's.
func (s *Store) syncChecked(ctx context.Context, ino *inode, err error, held bool) error {
	if err == errCutSuspected {
		err = s.checkCut(ctx, ino, held)
	}
	if err == nil {
		err = ino.cutReported()
	}
	return err
}

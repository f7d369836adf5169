//go:build linux

package store

import (
	"context"
	"errors"
	"hash/crc32"
	"slices"
	"sync"
	"time"
)

// appendIDWindow remembers the results of recent appends by (path, ID),
// for resends of an append whose reply was lost: at most max of them, each
// for at most ttl. journal, if not nil, keeps them on disk too (see
// appendJournal); the window is loaded from it at Open.
type appendIDWindow struct {
	// max, ttl and journal are set by Open and never changed.
	max     int
	ttl     time.Duration
	journal *appendJournal

	// mu guards the fields below: a leaf, never held across I/O; taken
	// alone, or under an inode lock by reserved.
	mu    sync.Mutex
	byKey map[appendKey]*appendRecord
	order []*appendRecord // oldest first
	// owned are the records whose appends are running, by the ID and the
	// data they append, for reserved to find their claims.
	owned map[ownedKey]*appendRecord
}

type appendKey struct{ path, id string }

// ownedKey finds a running append's record from where it reserves its
// range, which knows its ID and its data but not the path it was claimed
// by (a Handle's file is known by its inode there).
type ownedKey struct {
	id   string
	data *byte
}

// appendRecord is one remembered append. key, n, crc and at are
// immutable; res and err are written before done is closed.
type appendRecord struct {
	key  appendKey
	n    int
	crc  uint32
	at   time.Time
	done chan struct{}
	res  AppendResult
	err  error
	// unverified, guarded by appendIDWindow.mu, says the record was loaded
	// from the journal and its bytes were not checked yet; verifying, not
	// nil while a claimer checks them, is closed when it is done.
	unverified bool
	verifying  chan struct{}
	// ownedData, guarded by appendIDWindow.mu, is the data of the running
	// append that owns it, if it is in appendIDWindow.owned.
	ownedData *byte
	// journaled says the journal has a record of it: written and read by
	// the append's owner only.
	journaled bool
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// claimRole says what the caller of claim does with the record.
type claimRole int

const (
	// claimOwner: the caller appends, and settles the record.
	claimOwner claimRole = iota
	// claimReplay: the record's append finished: its result is the
	// caller's (or, with err, it failed and was forgotten: claim again).
	claimReplay
	// claimVerify: the record was loaded from the journal: the caller
	// checks its bytes (Store.landed), tells verified, and claims again.
	claimVerify
)

// claim returns the record of (path, id) and what the caller does with it
// (claimRole). It returns ErrAppendIDReused for a remembered id whose
// data differ.
func (w *appendIDWindow) claim(ctx context.Context, path, id string, data []byte) (*appendRecord, claimRole, error) {
	key := appendKey{path, id}
	crc := crc32.Checksum(data, castagnoli)
	var now time.Time
	for {
		w.mu.Lock()
		now = time.Now()
		w.expireLocked(now)
		rec := w.byKey[key]
		if rec == nil {
			break
		}
		if rec.n != len(data) || rec.crc != crc {
			w.mu.Unlock()
			return nil, 0, refuse(ErrAppendIDReused, "append_id", "append id %q was used for an append of %d bytes (CRC-32C %08x), this one has %d (%08x)", id, rec.n, rec.crc, len(data), crc)
		}
		wait := rec.done
		if rec.unverified {
			if rec.verifying == nil {
				rec.verifying = make(chan struct{})
				w.mu.Unlock()
				return rec, claimVerify, nil
			}
			wait = rec.verifying
		}
		w.mu.Unlock()
		select {
		case <-wait:
			if wait == rec.done {
				return rec, claimReplay, nil
			}
			// Verified or forgotten: look again.
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	if w.byKey == nil {
		w.byKey = make(map[appendKey]*appendRecord)
	}
	rec := &appendRecord{key: key, n: len(data), crc: crc, at: now, done: make(chan struct{})}
	w.byKey[key] = rec
	w.order = append(w.order, rec)
	for len(w.order) > w.max {
		w.dropOldestLocked()
	}
	if w.journal != nil && len(data) > 0 {
		if w.owned == nil {
			w.owned = make(map[ownedKey]*appendRecord)
		}
		// Two running appends with one ID and one buffer (to two paths)
		// cannot be told apart where they reserve: the second is
		// remembered in memory only.
		if ok := (ownedKey{id, &data[0]}); w.owned[ok] == nil {
			w.owned[ok] = rec
			rec.ownedData = &data[0]
		}
	}
	w.mu.Unlock()
	return rec, claimOwner, nil
}

// reserved is called by an append of data with ID id once its range
// starting at off is reserved, before its bytes are written: if a claim
// of appendOnce owns it, the journal records where it goes. It costs
// nothing without an ID.
func (w *appendIDWindow) reserved(id string, data []byte, off int64) {
	if id == "" || w.journal == nil || len(data) == 0 {
		return
	}
	w.mu.Lock()
	rec := w.owned[ownedKey{id, &data[0]}]
	w.mu.Unlock()
	if rec == nil {
		return
	}
	rec.journaled = true
	w.journal.add(journalRecord{at: rec.at.UnixNano(), off: off, n: int64(rec.n), crc: rec.crc, path: rec.key.path, id: rec.key.id})
}

// settle records the outcome of rec's append. A failed one is forgotten,
// so that a resend tries again (also by the journal, if it recorded it).
func (w *appendIDWindow) settle(rec *appendRecord, res AppendResult, err error) {
	rec.res, rec.err = res, err
	w.mu.Lock()
	if rec.ownedData != nil {
		delete(w.owned, ownedKey{rec.key.id, rec.ownedData})
		rec.ownedData = nil
	}
	if err != nil && w.byKey[rec.key] == rec {
		delete(w.byKey, rec.key)
	}
	w.mu.Unlock()
	if err != nil && rec.journaled {
		w.journal.add(journalRecord{forget: true, at: time.Now().UnixNano(), path: rec.key.path, id: rec.key.id})
	}
	close(rec.done)
}

// verified records the outcome of checking rec, loaded from the journal
// (claimVerify): if its bytes landed it is replayed from now on; if not
// it is forgotten, and the next claim appends afresh; on err (the check
// could not run) the next claimer checks again.
func (w *appendIDWindow) verified(rec *appendRecord, landed bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil:
	case landed:
		rec.unverified = false
	default:
		if w.byKey[rec.key] == rec {
			delete(w.byKey, rec.key)
		}
	}
	close(rec.verifying)
	rec.verifying = nil
}

// Preconditions: w.mu is held.
func (w *appendIDWindow) expireLocked(now time.Time) {
	for len(w.order) > 0 && now.Sub(w.order[0].at) > w.ttl {
		w.dropOldestLocked()
	}
}

// Preconditions: w.mu is held and w.order is not empty.
func (w *appendIDWindow) dropOldestLocked() {
	rec := w.order[0]
	w.order[0] = nil
	w.order = w.order[1:]
	if w.byKey[rec.key] == rec {
		delete(w.byKey, rec.key)
	}
}

// landed says whether the bytes of rec, loaded from the journal, are in
// its file: its range within the size readers see, with rec's CRC-32C.
// It reads them as Read does. An error is one of the read's own (ctx, a
// closed store), not a verdict.
func (s *Store) landed(ctx context.Context, path string, rec *appendRecord) (bool, error) {
	b, err := s.Read(ctx, path, rec.res.Offset, int64(rec.n))
	switch {
	case ctx.Err() != nil:
		return false, ctx.Err()
	case errors.Is(err, ErrClosed):
		return false, err
	case err != nil:
		return false, nil // missing, a directory, too large to read now
	}
	return len(b) == rec.n && crc32.Checksum(b, castagnoli) == rec.crc, nil
}

// loadJournal fills the window with the records of a journal Open loaded,
// oldest first: a forget record forgets its key, records older than the
// window's time bound are dropped, and so are those whose range ends past
// the size of their file now (sizeOf), since their bytes never landed
// whole; a resend of those appends afresh before any later append can
// take their range. What is left is unverified: a resend checks the bytes.
func (w *appendIDWindow) loadJournal(recs []journalRecord, now time.Time, sizeOf func(path string) (int64, bool)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byKey == nil {
		w.byKey = make(map[appendKey]*appendRecord)
	}
	sizes := make(map[string]int64)
	for _, r := range recs {
		key := appendKey{r.path, r.id}
		if r.forget {
			delete(w.byKey, key)
			continue
		}
		at := time.Unix(0, r.at)
		if now.Sub(at) > w.ttl || r.n <= 0 || r.off < 0 {
			continue
		}
		size, ok := sizes[r.path]
		if !ok {
			if size, ok = sizeOf(r.path); !ok {
				size = -1
			}
			sizes[r.path] = size
		}
		if r.off+r.n > size || r.off+r.n < r.off {
			delete(w.byKey, key) // a later record of the key wins, even a dropped one
			continue
		}
		rec := &appendRecord{
			key: key, n: int(r.n), crc: r.crc, at: at, done: closedChan,
			res: AppendResult{Offset: r.off, Size: r.off + r.n}, unverified: true,
		}
		w.byKey[key] = rec
		w.order = append(w.order, rec)
	}
	slices.SortStableFunc(w.order, func(a, b *appendRecord) int { return a.at.Compare(b.at) })
	for len(w.order) > w.max {
		w.dropOldestLocked()
	}
}

// closedChan is a closed channel: the done of a record loaded from the
// journal, whose append finished before the store opened.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

package uploads

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/filewrite/filewrite/store"
)

// Sweep removes the uploads that expired: an incomplete one that went
// Config.Expiry without a PATCH (its staged bytes and its record), and
// the record of a complete one Config.Expiry after it completed. It
// finishes the publish of a complete upload that the daemon stopped in
// the middle of (its record says done, its staged file is still there),
// and removes staged files that lost their record. An upload a request
// holds now is left for the next sweep.
func (d *Door) Sweep(ctx context.Context) {
	now := time.Now()
	recs, err := d.cfg.Store.Records()
	if err != nil {
		d.log.Warn("tus: sweep: list the uploads", "error", err)
		return
	}
	staged, err := d.cfg.Store.Staged()
	if err != nil {
		d.log.Warn("tus: sweep: list the staged files", "error", err)
		return
	}
	stagedAt := make(map[string]int64, len(staged))
	for _, sf := range staged {
		stagedAt[sf.Name] = sf.Ctime
	}
	for _, r := range recs {
		id, ok := strings.CutPrefix(r.Name, "tus-")
		if !ok || !validID(id) {
			continue
		}
		d.sweepOne(ctx, id, r.Ctime, stagedAt, now)
		delete(stagedAt, r.Name)
	}
	for name, ctime := range stagedAt {
		id, ok := strings.CutPrefix(name, "tus-")
		if !ok || !validID(id) || now.Before(d.expiresAt(ctime)) {
			continue
		}
		// A staged file without a record: the daemon stopped between
		// creating the two, or between removing them.
		if lk, ok := d.locks.tryLock(id); ok {
			if err := d.cfg.Store.RemoveStaged(ctx, name); err != nil && !errors.Is(err, store.ErrNotFound) {
				d.log.Warn("tus: sweep: remove a staged file", "id", id, "error", err)
			}
			lk.Unlock()
		}
	}
}

// sweepOne is Sweep of upload id, whose record changed at recTime.
func (d *Door) sweepOne(ctx context.Context, id string, recTime int64, stagedAt map[string]int64, now time.Time) {
	lk, ok := d.locks.tryLock(id)
	if !ok {
		return // a request holds it: not idle
	}
	defer lk.Unlock()
	b, err := d.cfg.Store.Record(stagedName(id))
	if err != nil {
		return // removed meanwhile
	}
	rec := &record{}
	if err := json.Unmarshal(b, rec); err != nil {
		d.log.Warn("tus: sweep: a damaged upload record; removing the upload once it expires", "id", id, "error", err)
		rec = &record{ID: id}
	}
	last := recTime
	stagedTime, hasStaged := stagedAt[stagedName(id)]
	if hasStaged {
		last = max(last, stagedTime)
	}
	if rec.Done && hasStaged && !rec.Partial {
		// The daemon stopped in the middle of the publish: finish it,
		// without a caller to check (the caller's PATCH was).
		if err := d.publishStaged(ctx, rec); err != nil {
			d.log.Warn("tus: sweep: publish a complete upload", "id", id, "target", rec.Target, "error", err)
		} else {
			return
		}
	}
	if now.Before(d.expiresAt(last)) {
		return
	}
	if err := d.remove(ctx, id); err != nil {
		d.log.Warn("tus: sweep: remove an expired upload", "id", id, "error", err)
		return
	}
	d.log.Info("tus: upload expired", "id", id, "target", rec.Target, "done", rec.Done)
}

// Run sweeps once now, then every interval (a tenth of Config.Expiry, at
// most an hour) until ctx ends.
func (d *Door) Run(ctx context.Context) {
	every := min(d.cfg.Expiry/10, time.Hour)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		d.Sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

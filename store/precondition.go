//go:build linux

package store

import (
	"context"
	"errors"
	"fmt"
)

// ReasonPrecondition is recorded with the lock a conditional mutation
// takes: exclusive, whatever the policy, after the writes in flight.
const ReasonPrecondition = "precondition"

// Precondition makes a mutation conditional on the file's generation
// (FileStat.Generation), as GCS's ifGenerationMatch and
// ifGenerationNotMatch do. The zero value is no condition, and costs
// nothing. A mutation with one holds the file's lock exclusively and waits
// for the writes in flight (as Truncate does) before it checks, so that
// nothing lands between the check and the change; if the check fails it
// changes nothing (creates nothing) and returns a *GenerationMismatch.
//
// The fields take a proto3 optional int64 as it is: nil is absent.
type Precondition struct {
	// IfMatch, if not nil, is the generation the file must have; 0 means
	// that no file may exist at the path.
	IfMatch *int64
	// IfNotMatch, if not nil, is a generation the file must not have; 0
	// means that a file must exist at the path.
	IfNotMatch *int64
}

// validate refuses a negative generation: a request that names one
// changes nothing.
func (p Precondition) validate() error {
	for _, f := range []struct {
		arg string
		gen *int64
	}{{"if_generation_match", p.IfMatch}, {"if_generation_not_match", p.IfNotMatch}} {
		if f.gen != nil && *f.gen < 0 {
			return refuse(ErrInvalidOffset, f.arg, "generation %d is negative", *f.gen)
		}
	}
	return nil
}

// present reports whether p asks for anything.
func (p Precondition) present() bool { return p.IfMatch != nil || p.IfNotMatch != nil }

// missingHolds reports whether p holds where no file exists: only "no file
// may exist" does.
func (p Precondition) missingHolds() bool {
	return p.IfNotMatch == nil && p.IfMatch != nil && *p.IfMatch == 0
}

// check returns a *GenerationMismatch unless p holds for a file whose
// generation is gen (0: none exists).
func (p Precondition) check(path string, gen int64) error {
	ok := true
	if p.IfMatch != nil {
		ok = gen == *p.IfMatch
	}
	if p.IfNotMatch != nil {
		if *p.IfNotMatch == 0 {
			ok = ok && gen != 0
		} else {
			ok = ok && gen != 0 && gen != *p.IfNotMatch
		}
	}
	if ok {
		return nil
	}
	return &GenerationMismatch{Path: path, Precondition: p, Current: gen}
}

// ErrGenerationMismatch is returned (as a *GenerationMismatch) by a
// mutation whose Precondition does not hold: it changed nothing.
var ErrGenerationMismatch = errors.New("generation precondition failed")

// GenerationMismatch is the error of a mutation whose Precondition does
// not hold. It is an ErrGenerationMismatch.
type GenerationMismatch struct {
	// Path is the file the precondition was on (a Rename's old or new
	// name).
	Path         string
	Precondition Precondition
	// Current is the file's generation when it was checked; 0 if no file
	// existed.
	Current int64
}

func (e *GenerationMismatch) Error() string {
	var want string
	if m := e.Precondition.IfMatch; m != nil {
		if *m == 0 {
			want = "no file"
		} else {
			want = fmt.Sprintf("generation %d", *m)
		}
	}
	if m := e.Precondition.IfNotMatch; m != nil {
		if want != "" {
			want += " and "
		}
		if *m == 0 {
			want += "a file"
		} else {
			want += fmt.Sprintf("a generation other than %d", *m)
		}
	}
	have := "no file"
	if e.Current != 0 {
		have = fmt.Sprintf("generation %d", e.Current)
	}
	return fmt.Sprintf("%v: %s: wanted %s, found %s", ErrGenerationMismatch, e.Path, want, have)
}

func (e *GenerationMismatch) Unwrap() error { return ErrGenerationMismatch }

// lockIf returns path's inode, with a reference held and its lock held
// exclusively for op with no write in flight, once pre holds for it: the
// conditional form of lockFile. With create, and a precondition that a
// missing file meets ("no file may exist"), a missing file is created
// (created is true), locked before anyone can reach it; any other
// precondition is never met by a missing file, which is not created. A
// missing file that pre allows is ErrNotFound, for the operation to answer
// as it would without a precondition.
func (s *Store) lockIf(ctx context.Context, path string, create bool, pre Precondition, op string) (ino *inode, h *holder, created bool, err error) {
	for {
		if create && pre.missingHolds() {
			ino, h, err = s.table.getOrCreate(ctx, path, op, ReasonPrecondition)
			created = h != nil
		} else {
			ino, err = s.table.get(ctx, path, false)
		}
		if errors.Is(err, ErrNotFound) {
			if cerr := pre.check(path, 0); cerr != nil {
				return nil, nil, false, cerr
			}
			return nil, nil, false, err
		}
		if err != nil {
			return nil, nil, false, err
		}
		if h == nil {
			if h, err = lockInode(ctx, ino, lockExclusive, op, ReasonPrecondition); err != nil {
				s.table.put(ino)
				return nil, nil, false, err
			}
			if err = s.checkNamed(ino, path); err != nil {
				ino.lock.release(h)
				s.table.put(ino)
				h = nil
				if errors.Is(err, ErrDeleted) || errors.Is(err, errNameMoved) {
					continue // what path names now
				}
				return nil, nil, false, err
			}
		}
		if err = s.checkLocked(ctx, ino, path, created, pre); err != nil {
			ino.lock.release(h)
			s.table.put(ino)
			return nil, nil, false, err
		}
		return ino, h, created, nil
	}
}

// checkLocked waits for the writes in flight to ino and checks pre on the
// file, which this call created if created (it then counts as missing).
//
// Preconditions: ino.lock is held exclusively.
func (s *Store) checkLocked(ctx context.Context, ino *inode, path string, created bool, pre Precondition) error {
	if err := waitInflight(ctx, ino, ReasonPrecondition); err != nil {
		return err
	}
	gen := ino.gen.Load()
	if created {
		gen = 0
	}
	return pre.check(path, gen)
}

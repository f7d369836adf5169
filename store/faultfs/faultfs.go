// Package faultfs is a store.FS that fails on command, so that tests can
// reach the errors a real disk gives rarely and at bad moments: ENOSPC and
// EDQUOT in the middle of a write, EIO from write, fsync or ftruncate,
// fallocate refused for lack of space or support, an open refused for lack
// of descriptors.
//
// An FS wraps another store.FS and passes every call through until a test
// injects a Rule. A rule picks calls by operation, path and byte range, and
// says what happens to them: the error they fail with, how many bytes of a
// write still reach the file first (a real short write), whether they wait
// for the test before acting, and how many calls it applies to. Rules can be
// added and removed while the store runs; the FS is safe for concurrent use.
//
//	fsys := faultfs.New(osfs)
//	full := fsys.Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "f", After: 5000, Err: syscall.ENOSPC})
//	defer full.Remove()
//
// Failures look like the operating system's: an *os.PathError wrapping the
// syscall.Errno, so errors.Is(err, syscall.ENOSPC) holds as it would for a
// real disk.
package faultfs

import (
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"

	"github.com/filewrite/filewrite/store"
)

// Op is a file operation a rule can fail.
type Op int

const (
	// OpWrite is File.WriteAt (pwrite).
	OpWrite Op = iota + 1
	// OpSync is File.Sync (fdatasync or fsync).
	OpSync
	// OpFallocate is File.Fallocate.
	OpFallocate
	// OpTruncate is File.Truncate (ftruncate).
	OpTruncate
	// OpWriteBack is File.WriteBack (sync_file_range). A failing one
	// leaves the range dirty, as a failed writeback would.
	OpWriteBack
	// OpExtents is File.Extents (FIEMAP), which the store calls to rebuild
	// its extent map when it opens a file.
	OpExtents
	// OpOpen is FS.OpenFile (open(2)) of a file; directories are not
	// subject to it. A failing open creates nothing.
	OpOpen
)

func (o Op) String() string {
	switch o {
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpFallocate:
		return "fallocate"
	case OpTruncate:
		return "truncate"
	case OpWriteBack:
		return "writeback"
	case OpExtents:
		return "extents"
	case OpOpen:
		return "open"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Rule selects calls and says how they fail. The zero value of each field
// other than Op selects everything and changes nothing.
type Rule struct {
	// Op is the operation the rule applies to.
	Op Op
	// Path limits the rule to files opened by this name, as the store names
	// them (slash-separated, relative to the root). Empty means every file.
	Path string
	// Off and Len limit the rule to calls whose byte range overlaps
	// [Off, Off+Len); Len 0 means [Off, ∞). A write's range is the bytes it
	// writes, a fallocate's the range it is given, a truncate's the single
	// byte at the new size, a writeback's the range it writes back. Sync,
	// Extents and Open have no range: a rule for them must leave both zero.
	Off, Len int64
	// Err is the errno matching calls fail with. A failing call does not
	// reach the underlying file, except for the bytes a short write lets
	// through (see After): a failed sync leaves the data dirty, a failed
	// fallocate or truncate changes nothing. Zero makes a rule that only
	// holds calls (see Hold) and then lets them through.
	Err syscall.Errno
	// After, for OpWrite only, is how many bytes matching writes may still
	// write before they fail, like the free space of a disk about to fill:
	// the write that crosses it writes the bytes that fit, really, to the
	// underlying file and then fails with Err (a short write); later ones
	// fail at once. Writes that fit entirely pass through and do not count
	// as hits.
	After int64
	// Times is how many calls the rule hits before it retires; 0 means no
	// limit (until Remove).
	Times int
	// Hold, when not nil, makes each call the rule hits wait until Hold is
	// closed before it acts, so a test can line up concurrent callers
	// behind, say, a sync that is about to fail.
	Hold <-chan struct{}
}

func (r Rule) validate() error {
	switch {
	case r.Op < OpWrite || r.Op > OpOpen:
		return fmt.Errorf("faultfs: unknown op %v", r.Op)
	case r.Op.rangeless() && (r.Off != 0 || r.Len != 0):
		return fmt.Errorf("faultfs: %v has no byte range, but the rule gives [%d, +%d)", r.Op, r.Off, r.Len)
	case r.After != 0 && r.Op != OpWrite:
		return fmt.Errorf("faultfs: After applies to OpWrite only, not %v", r.Op)
	case r.Off < 0 || r.Len < 0 || r.After < 0 || r.Times < 0:
		return fmt.Errorf("faultfs: negative field in %+v", r)
	}
	return nil
}

// FS is a store.FS that passes calls to another until rules make them fail.
type FS struct {
	base store.FS

	// mu guards rules and the mutable fields of every Fault. It is never
	// held across a call to the underlying FS or while a call is held.
	mu    sync.Mutex
	rules []*Fault // in injection order; the first that matches applies
}

var _ store.FS = (*FS)(nil)

// New wraps base. The returned FS owns base: Close closes it.
func New(base store.FS) *FS { return &FS{base: base} }

// Fault is an injected rule. Its methods are safe for concurrent use.
type Fault struct {
	fsys *FS
	rule Rule

	// Guarded by fsys.mu.
	hits    int
	budget  int64 // bytes matching writes may still write (OpWrite)
	retired bool
}

// Inject adds r after the rules already injected; where several match a
// call, the oldest that has not retired applies. It panics if r is
// malformed (an unknown Op, a range on OpSync, After on anything but
// OpWrite, a negative field): that is a mistake in the test.
func (f *FS) Inject(r Rule) *Fault {
	if err := r.validate(); err != nil {
		panic(err)
	}
	flt := &Fault{fsys: f, rule: r, budget: r.After}
	f.mu.Lock()
	f.rules = append(f.rules, flt)
	f.mu.Unlock()
	return flt
}

// Reset removes every rule. Calls already held stay held until their Hold
// is closed.
func (f *FS) Reset() {
	f.mu.Lock()
	for _, flt := range f.rules {
		flt.retired = true
	}
	f.rules = nil
	f.mu.Unlock()
}

// Hits is how many calls the rule has hit so far (counted when a call is
// hit, before it waits on Hold), so a test can wait until a call is inside.
func (flt *Fault) Hits() int {
	flt.fsys.mu.Lock()
	defer flt.fsys.mu.Unlock()
	return flt.hits
}

// Remove retires the rule: later calls no longer match it.
func (flt *Fault) Remove() {
	f := flt.fsys
	f.mu.Lock()
	defer f.mu.Unlock()
	flt.retired = true
	for i, r := range f.rules {
		if r == flt {
			f.rules = append(f.rules[:i:i], f.rules[i+1:]...)
			break
		}
	}
}

// verdict is what the rules decided for one call.
type verdict struct {
	err   syscall.Errno   // 0: the call goes through
	allow int64           // OpWrite: bytes that reach the file before err
	hold  <-chan struct{} // check waits for it to close, unless nil
}

// check finds the rule for a call of op on name over [off, off+n) and
// charges it (decide), then waits for the rule's Hold, if any, with f's
// lock dropped: every call waits before it fails or goes through.
func (f *FS) check(op Op, name string, off, n int64) verdict {
	v := f.decide(op, name, off, n)
	if v.hold != nil {
		<-v.hold
	}
	return v
}

// decide is check without the wait: the rule for the call, charged with a
// hit, and for a write the bytes it may still write.
func (f *FS) decide(op Op, name string, off, n int64) verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, flt := range f.rules {
		r := flt.rule
		if flt.retired || r.Op != op || (r.Path != "" && r.Path != name) || !r.overlaps(op, off, n) {
			continue
		}
		v := verdict{err: r.Err, allow: n, hold: r.Hold}
		if op == OpWrite && r.Err != 0 {
			if n <= flt.budget {
				// It fits in the space left: a plain write, not a hit.
				flt.budget -= n
				return verdict{allow: n}
			}
			v.allow, flt.budget = flt.budget, 0
		}
		flt.hits++
		if r.Times > 0 && flt.hits >= r.Times {
			flt.retired = true
		}
		return v
	}
	return verdict{allow: n}
}

// rangeless reports whether o has no byte range (see Rule.Off).
func (o Op) rangeless() bool { return o == OpSync || o == OpExtents || o == OpOpen }

func (r Rule) overlaps(op Op, off, n int64) bool {
	if op.rangeless() {
		return true
	}
	if op == OpTruncate {
		n = 1 // the new size, as a point
	}
	if r.Len == 0 {
		return off+n > r.Off
	}
	return off < r.Off+r.Len && off+n > r.Off
}

// OpenFile implements store.FS: OpOpen rules apply to it, and the file it
// returns is subject to the others.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	v := f.check(OpOpen, name, 0, 0)
	if v.err != 0 {
		return nil, &os.PathError{Op: "open", Path: name, Err: v.err}
	}
	file, err := f.base.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fsys: f, name: name}, nil
}

// MkdirAll implements store.FS; no rule applies to it.
func (f *FS) MkdirAll(name string, perm fs.FileMode) error { return f.base.MkdirAll(name, perm) }

// SyncDir implements store.FS; no rule applies to it.
func (f *FS) SyncDir(name string) error { return f.base.SyncDir(name) }

// Mkdir implements store.FS; no rule applies to it.
func (f *FS) Mkdir(name string, perm fs.FileMode) error { return f.base.Mkdir(name, perm) }

// Remove implements store.FS; no rule applies to it.
func (f *FS) Remove(name string) error { return f.base.Remove(name) }

// Rename implements store.FS; no rule applies to it.
func (f *FS) Rename(oldName, newName string, noReplace bool) error {
	return f.base.Rename(oldName, newName, noReplace)
}

// Stat implements store.FS; no rule applies to it.
func (f *FS) Stat(name string) (store.FileInfo, error) { return f.base.Stat(name) }

// Lstat implements store.FS; no rule applies to it.
func (f *FS) Lstat(name string) (store.FileInfo, error) { return f.base.Lstat(name) }

// OpenDir implements store.FS; no rule applies to it.
func (f *FS) OpenDir(name string) (store.Dir, error) { return f.base.OpenDir(name) }

// Close implements store.FS by closing the underlying FS.
func (f *FS) Close() error { return f.base.Close() }

// faultFile applies its FS's rules to the six operations that can fail;
// ReadAt, Stat and Close pass straight through to the embedded File. Every
// method that reports on the file's data or blocks is written out, so that
// a method added to store.File is not served by the embedded File unseen.
type faultFile struct {
	store.File
	fsys *FS
	name string
}

var _ store.File = (*faultFile)(nil)

// fail builds the error the OS would return: *os.PathError around the
// errno, as *os.File and the store's own osFile do.
func (f *faultFile) fail(op string, errno syscall.Errno) error {
	return &os.PathError{Op: op, Path: f.name, Err: errno}
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	v := f.fsys.check(OpWrite, f.name, off, int64(len(p)))
	if v.err == 0 {
		return f.File.WriteAt(p, off)
	}
	n := 0
	if v.allow > 0 {
		// The part that fits really reaches the file, so that the store's
		// view after the error can be checked against the disk.
		var err error
		n, err = f.File.WriteAt(p[:v.allow], off)
		if err != nil {
			return n, err
		}
	}
	return n, f.fail("write", v.err)
}

func (f *faultFile) Sync(mode store.SyncMode) error {
	v := f.fsys.check(OpSync, f.name, 0, 0)
	if v.err != 0 {
		op := "fsync"
		if mode != store.SyncFull {
			op = "fdatasync"
		}
		return f.fail(op, v.err)
	}
	return f.File.Sync(mode)
}

func (f *faultFile) Fallocate(mode uint32, off, length int64) error {
	v := f.fsys.check(OpFallocate, f.name, off, length)
	if v.err != 0 {
		return f.fail("fallocate", v.err)
	}
	return f.File.Fallocate(mode, off, length)
}

func (f *faultFile) Truncate(size int64) error {
	v := f.fsys.check(OpTruncate, f.name, size, 0)
	if v.err != 0 {
		return f.fail("truncate", v.err)
	}
	return f.File.Truncate(size)
}

func (f *faultFile) WriteBack(off, n int64) error {
	v := f.fsys.check(OpWriteBack, f.name, off, n)
	if v.err != 0 {
		return f.fail("sync_file_range", v.err)
	}
	return f.File.WriteBack(off, n)
}

func (f *faultFile) Extents() ([]store.Extent, error) {
	v := f.fsys.check(OpExtents, f.name, 0, 0)
	if v.err != 0 {
		return nil, f.fail("extents", v.err)
	}
	return f.File.Extents()
}

// Package crashfs is a store.FS that can cut the power: it passes every call
// to a real FS, remembers what a sync has not yet made durable, and on
// Crash writes out, into a fresh directory, the files and directories a
// power cut at that moment could leave. A store reopened there shows
// whether what it acknowledged as durable really was.
//
// It follows pebble's strict MemFS and CrashMonkey. State is kept per file
// (per inode, not per descriptor: a file opened buffered and O_DIRECT is
// one file, so a write through one descriptor is made durable by a sync
// through the other) and per directory:
//
//   - a file keeps every write, truncate and fallocate that completed since
//     it was created, and how many of them its last successful sync covered;
//   - a directory keeps its entries as they were at its last successful
//     sync, and the entries created, replaced or removed since.
//
// What a sync covers is decided when it is called, not when it returns: an
// operation on the file (or in the directory) that had completed by then
// is covered, one that completes while the sync runs is not, although the
// kernel may well have written it. A sync that fails covers nothing.
// WriteBack (sync_file_range) makes nothing durable. A write through a
// descriptor opened with O_DSYNC (or O_SYNC) that returns OK is durable by
// itself, and makes nothing else durable: as the kernel's, its sync covers
// its own range.
//
// Crash freezes the FS: every later call fails with EIO, and nothing
// completes, becomes durable or is recorded after it. The State it returns
// writes out a crashed image for a choice of the operations that were not
// durable (Keep): each such operation is cut into Pieces that survive or
// vanish independently, a write into one piece per block it touches plus
// one for its growth of the size, so that a torn write, data without its
// size (lost past EOF) and a size without its data (zeros) are all
// possible; a truncate or fallocate is one piece, and so is each directory
// entry change. A rename is one piece: its two entry changes survive or
// vanish together (rename(2) is atomic, and a journaling filesystem commits
// it in one transaction), and it is durable once both its directories were
// synced after it, the fsyncs POSIX asks for. An entry change the cut kept
// keeps the earlier changes of the same entry and those that put the
// directories above it in place, as a filesystem that orders its metadata
// writes them first (no image renames a name that was never made);
// NewUnordered drops that second rule, for a filesystem that does not
// order its metadata writes. Either way a sync makes durable only its own
// directory's entries, and a durable change keeps nothing by itself (POSIX
// promises no more), so a name is durable only once every directory up its
// path was synced after it appeared.
// Durable operations are always kept. The image is made by
// replaying the kept operations, in the order they completed, onto real
// files with the same system calls, so its extents (holes, unwritten and
// written blocks) are the filesystem's own, as a store reopened there
// rebuilds them through File.Extents.
//
// The FS it wraps must start empty: crashfs sees only the names created
// through it.
package crashfs

import (
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/filewrite/filewrite/store"
)

// FS is a store.FS that records what is durable and can crash. It is safe
// for concurrent use.
//
// Lock order:
//
//	FS.freezeMu    (read-held while an operation is recorded; Crash takes it
//	                to freeze)
//	  FS.nsMu      (the directory tree: every dirNode's fields)
//	    fileNode.mu (one file's operations)
type FS struct {
	base store.FS

	// seq numbers the recorded operations in the order they completed. It
	// is advanced with the owning node's lock held (nsMu for directory
	// entries, fileNode.mu for a file), so that an operation numbered below
	// a sync's snapshot is already recorded when the sync takes it.
	seq atomic.Uint64

	// freezeMu guards frozen. Every change to the recorded state is made
	// with it read-held after checking frozen, so that once Crash has held
	// it, nothing changes.
	freezeMu sync.RWMutex
	frozen   bool

	// nsMu guards the directory tree below root and files. It is held
	// across the underlying call of an operation that changes the tree
	// (create, mkdir, rename, remove), so that the tree and the disk change
	// in the same order.
	nsMu  sync.Mutex
	root  *dirNode
	files int // fileNodes created, for their ids

	// unordered: a change of an entry does not keep the changes that put
	// the directories above it in place (NewUnordered). Immutable.
	unordered bool
}

var _ store.FS = (*FS)(nil)

// New wraps base, which must hold no files yet. The FS owns base: Close
// closes it.
func New(base store.FS) *FS {
	return &FS{base: base, root: newDirNode()}
}

// NewUnordered is New for a filesystem that does not order its metadata
// writes (ext2, or ext4 without a journal): an entry change that survives
// the cut brings with it only the earlier changes of the same entry, not
// the creation of the directories above it, so an image may hold a name
// in a directory that nothing reaches (the name is then lost with it).
func NewUnordered(base store.FS) *FS {
	f := New(base)
	f.unordered = true
	return f
}

// node is a directory entry's target: a directory or a file.
type node struct {
	dir  *dirNode
	file *fileNode
}

// dirNode is one directory. Its fields are guarded by FS.nsMu.
type dirNode struct {
	// live is what the directory holds now.
	live map[string]*node
	// durable is what it held after the last entry change that is durable
	// with every one before it; pending are the changes since, in the
	// order they completed. Some of pending may be durable too: those
	// behind a rename whose other directory was not synced after it.
	durable map[string]*node
	pending []entryOp
	// synced is the last seq a successful sync of the directory covered.
	synced uint64
	// linkedBy is the piece of the entry change that put the directory
	// where it is (zero for the root): an entry change below it that the
	// cut keeps keeps that piece too, unless it is durable.
	linkedBy Piece
}

func newDirNode() *dirNode {
	return &dirNode{live: make(map[string]*node), durable: make(map[string]*node)}
}

// entryOp names target name in a directory, or removes name (target nil).
type entryOp struct {
	seq    uint64
	name   string
	target *node
	path   string // the entry's path, for Pieces
	// rename is set on both entry changes of one rename.
	rename *renameOp
	// above are the pieces a kept op keeps: the change of the same entry
	// before it, and for a link those that put the directories above it in
	// place (durable ones among them).
	above []Piece
}

// renameOp is one rename(2): the entry changes it made in from and in to
// (one directory, or two) are one piece.
type renameOp struct {
	from, to *dirNode
	piece    Piece
	above    []Piece // as entryOp.above, for both entries
}

// durable reports whether op, an entry change of d, is durable: covered by
// a sync of d, or, for a rename, by syncs of both its directories.
//
// Preconditions: FS.nsMu is held, or the FS is frozen.
func (op *entryOp) durable(d *dirNode) bool {
	if op.rename != nil {
		return op.seq <= op.rename.from.synced && op.seq <= op.rename.to.synced
	}
	return op.seq <= d.synced
}

// piece is the Piece that keeps or loses op, and the pieces a kept op
// keeps with it.
func (op *entryOp) piece() (p Piece, above []Piece) {
	switch {
	case op.rename != nil:
		return op.rename.piece, op.rename.above
	case op.target == nil:
		return Piece{Kind: PieceUnlink, Path: op.path, Seq: op.seq}, op.above
	}
	return Piece{Kind: PieceLink, Path: op.path, Seq: op.seq}, op.above
}

// lastChange is the piece of the latest change of entry name still in
// d.pending, if any.
//
// Preconditions: FS.nsMu is held.
func (d *dirNode) lastChange(name string) []Piece {
	for i := len(d.pending) - 1; i >= 0; i-- {
		if d.pending[i].name == name {
			p, _ := d.pending[i].piece()
			return []Piece{p}
		}
	}
	return nil
}

// settle folds into d.durable the durable changes at the head of
// d.pending.
//
// Preconditions: FS.nsMu is held.
func (d *dirNode) settle() {
	i := 0
	for ; i < len(d.pending) && d.pending[i].durable(d); i++ {
		op := d.pending[i]
		if op.target == nil {
			delete(d.durable, op.name)
		} else {
			d.durable[op.name] = op.target
		}
	}
	d.pending = append(d.pending[:0:0], d.pending[i:]...)
}

// fileNode is one file (an inode).
type fileNode struct {
	id        int    // creation order
	path      string // the name it was created under
	blockSize int64  // st_blksize, the grain of torn writes

	// mu guards ops and durable.
	mu sync.Mutex
	// ops are the file's operations since it was created, in the order
	// they completed (increasing seq).
	ops []fileOp
	// durable is how many of ops a successful sync covered.
	durable int
}

type opKind int

const (
	opWrite opKind = iota + 1
	opTruncate
	opFallocate
)

// fileOp is one completed operation on a file.
type fileOp struct {
	seq  uint64
	kind opKind
	off  int64  // write, fallocate
	data []byte // write: the bytes that reached the file
	size int64  // truncate: the new size; fallocate: the length
	mode uint32 // fallocate: FALLOC_FL_* flags
	// synced: a write through an O_DSYNC descriptor, durable once it
	// completed, whatever syncs come or do not.
	synced bool
}

// errFrozen is what every call gets after Crash: a dead disk's EIO.
func errFrozen(op, name string) error {
	return &os.PathError{Op: op, Path: name, Err: syscall.EIO}
}

// record runs fn, which changes the recorded state, unless the FS is
// frozen; then it reports EIO as op on name.
func (f *FS) record(op, name string, fn func()) error {
	f.freezeMu.RLock()
	defer f.freezeMu.RUnlock()
	if f.frozen {
		return errFrozen(op, name)
	}
	fn()
	return nil
}

func (f *FS) isFrozen() bool {
	f.freezeMu.RLock()
	defer f.freezeMu.RUnlock()
	return f.frozen
}

// lookupLocked finds name in the live tree: its node (nil if missing),
// and the directory that holds it with the entry's base name (nil if a
// parent is missing or is not a directory). "." is the root, which no
// directory holds.
//
// Preconditions: f.nsMu is held.
func (f *FS) lookupLocked(name string) (n *node, parent *dirNode, base string) {
	if name == "." || name == "" {
		return &node{dir: f.root}, nil, ""
	}
	d := f.root
	parts := strings.Split(name, "/")
	for _, p := range parts[:len(parts)-1] {
		next := d.live[p]
		if next == nil || next.dir == nil {
			return nil, nil, ""
		}
		d = next.dir
	}
	base = parts[len(parts)-1]
	return d.live[base], d, base
}

// setEntryLocked records that d's entry base now names target (nil:
// removed).
//
// Preconditions: f.nsMu and f.freezeMu (read) are held, f is not frozen.
func (f *FS) setEntryLocked(d *dirNode, base, entryPath string, target *node) {
	op := entryOp{seq: f.seq.Add(1), name: base, target: target, path: entryPath, above: d.lastChange(base)}
	if target == nil {
		delete(d.live, base)
	} else {
		if !f.unordered {
			op.above = append(op.above, f.aboveLocked(entryPath)...)
		}
		d.live[base] = target
		if target.dir != nil {
			target.dir.linkedBy, _ = op.piece()
		}
	}
	d.pending = append(d.pending, op)
}

// renameLocked records that n, named oldBase in from, is now named newBase
// in to, replacing what was there.
//
// Preconditions: as setEntryLocked's.
func (f *FS) renameLocked(from *dirNode, oldBase, oldName string, to *dirNode, newBase, newName string, n *node) {
	seq := f.seq.Add(1)
	r := &renameOp{
		from: from, to: to,
		piece: Piece{Kind: PieceRename, Path: newName, From: oldName, Seq: seq},
		above: slices.Concat(from.lastChange(oldBase), to.lastChange(newBase)),
	}
	if !f.unordered {
		r.above = append(r.above, f.aboveLocked(newName)...)
	}
	delete(from.live, oldBase)
	from.pending = append(from.pending, entryOp{seq: seq, name: oldBase, path: oldName, rename: r})
	to.live[newBase] = n
	to.pending = append(to.pending, entryOp{seq: seq, name: newBase, target: n, path: newName, rename: r})
	if n.dir != nil {
		n.dir.linkedBy = r.piece
	}
}

// aboveLocked lists the pieces that put the directories above name in
// place, durable or not.
//
// Preconditions: f.nsMu is held.
func (f *FS) aboveLocked(name string) []Piece {
	var out []Piece
	d := f.root
	parts := strings.Split(name, "/")
	for _, p := range parts[:len(parts)-1] {
		next := d.live[p]
		if next == nil || next.dir == nil {
			break
		}
		d = next.dir
		if d.linkedBy != (Piece{}) {
			out = append(out, d.linkedBy)
		}
	}
	return out
}

// OpenFile implements store.FS. Creating a file adds an entry to its
// directory that is not durable until that directory is synced.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	if f.isFrozen() {
		return nil, errFrozen("open", name)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	n, parent, base := f.lookupLocked(name)
	created := n == nil && parent != nil && flag&os.O_CREATE != 0
	bf, err := f.base.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	if n == nil && !created {
		bf.Close()
		return nil, fmt.Errorf("crashfs: %s exists on disk but was not created through crashfs", name)
	}
	if n != nil && n.dir != nil {
		// A directory: nothing to record, but it fails like the rest
		// once frozen.
		return &file{fsys: f, base: bf, name: name}, nil
	}
	if created {
		fi, err := bf.Stat()
		if err != nil {
			bf.Close()
			return nil, err
		}
		fn := &fileNode{id: f.files, path: name, blockSize: fi.BlockSize}
		if fn.blockSize <= 0 {
			fn.blockSize = 4096
		}
		f.files++
		n = &node{file: fn}
		if err := f.record("open", name, func() { f.setEntryLocked(parent, base, name, n) }); err != nil {
			bf.Close()
			return nil, err
		}
	}
	fl := &file{fsys: f, base: bf, node: n.file, name: name, dsync: flag&syscall.O_DSYNC != 0}
	if flag&os.O_TRUNC != 0 && !created {
		if err := fl.recordOp(fileOp{kind: opTruncate}); err != nil {
			bf.Close()
			return nil, err
		}
	}
	return fl, nil
}

// MkdirAll implements store.FS. Each directory it creates is an entry of
// its parent that is not durable until the parent is synced.
func (f *FS) MkdirAll(name string, perm fs.FileMode) error {
	if f.isFrozen() {
		return errFrozen("mkdir", name)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	if err := f.base.MkdirAll(name, perm); err != nil {
		return err
	}
	return f.record("mkdir", name, func() {
		d := f.root
		parts := strings.Split(name, "/")
		for i, p := range parts {
			next := d.live[p]
			if next == nil {
				next = &node{dir: newDirNode()}
				f.setEntryLocked(d, p, strings.Join(parts[:i+1], "/"), next)
			}
			if next.dir == nil {
				return // the base would have failed; nothing to model
			}
			d = next.dir
		}
	})
}

// SyncDir implements store.FS: when it returns nil, the entry changes of
// directory name that had completed when it was called are durable, but
// for renames to or from another directory not yet synced after them.
func (f *FS) SyncDir(name string) error {
	if f.isFrozen() {
		return errFrozen("fsync", name)
	}
	f.nsMu.Lock()
	n, _, _ := f.lookupLocked(name)
	snap := f.seq.Load()
	f.nsMu.Unlock()
	if err := f.base.SyncDir(name); err != nil {
		return err
	}
	if n == nil || n.dir == nil {
		return nil // the base synced something crashfs did not create
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	return f.record("fsync", name, func() {
		d := n.dir
		d.synced = max(d.synced, snap)
		// A rename this sync made durable may let the other directory's
		// changes behind it settle too.
		var others []*dirNode
		for _, op := range d.pending {
			if op.seq <= snap && op.rename != nil {
				others = append(others, op.rename.from, op.rename.to)
			}
		}
		d.settle()
		for _, o := range others {
			o.settle()
		}
	})
}

// Rename gives the entry oldName the name newName, replacing what newName
// named unless noReplace, like renameat2(2). Its two entry changes are one
// piece: a crash leaves the old name or the new one, never both or
// neither, and the new one once both directories were synced after it.
func (f *FS) Rename(oldName, newName string, noReplace bool) error {
	if f.isFrozen() {
		return errFrozen("rename", oldName)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	n, oldDir, oldBase := f.lookupLocked(oldName)
	if err := f.base.Rename(oldName, newName, noReplace); err != nil {
		return err
	}
	target, newDir, newBase := f.lookupLocked(newName)
	if n == nil || oldDir == nil || newDir == nil || target == n {
		return nil // not created through crashfs, or onto itself
	}
	return f.record("rename", oldName, func() {
		f.renameLocked(oldDir, oldBase, oldName, newDir, newBase, newName, n)
	})
}

// Mkdir implements store.FS. The directory is an entry of its parent that
// is not durable until the parent is synced.
func (f *FS) Mkdir(name string, perm fs.FileMode) error {
	if f.isFrozen() {
		return errFrozen("mkdir", name)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	if err := f.base.Mkdir(name, perm); err != nil {
		return err
	}
	_, parent, base := f.lookupLocked(name)
	if parent == nil {
		return nil // below something crashfs did not create
	}
	return f.record("mkdir", name, func() { f.setEntryLocked(parent, base, name, &node{dir: newDirNode()}) })
}

// Remove implements store.FS: unlink(2) or rmdir(2). The removal is
// durable when the directory is synced.
func (f *FS) Remove(name string) error {
	if f.isFrozen() {
		return errFrozen("remove", name)
	}
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	n, d, base := f.lookupLocked(name)
	if err := f.base.Remove(name); err != nil {
		return err
	}
	if n == nil || d == nil {
		return nil
	}
	return f.record("remove", name, func() { f.setEntryLocked(d, base, name, nil) })
}

// Stat implements store.FS: it records nothing.
func (f *FS) Stat(name string) (store.FileInfo, error) {
	if f.isFrozen() {
		return store.FileInfo{}, errFrozen("stat", name)
	}
	return f.base.Stat(name)
}

// Lstat implements store.FS: it records nothing.
func (f *FS) Lstat(name string) (store.FileInfo, error) {
	if f.isFrozen() {
		return store.FileInfo{}, errFrozen("lstat", name)
	}
	return f.base.Lstat(name)
}

// OpenDir implements store.FS: listing records nothing. (After Crash the
// listing of a directory opened before goes on: it changes nothing.)
func (f *FS) OpenDir(name string) (store.Dir, error) {
	if f.isFrozen() {
		return nil, errFrozen("open", name)
	}
	return f.base.OpenDir(name)
}

// Close implements store.FS by closing the wrapped FS; after Crash it
// still closes it, and reports EIO.
func (f *FS) Close() error {
	err := f.base.Close()
	if f.isFrozen() {
		return errFrozen("close", ".")
	}
	return err
}

// Crash cuts the power: every later call fails with EIO, an operation
// running now records nothing when it completes, and a sync running now
// makes nothing durable. It returns what was durable and what was not,
// from which State.Write makes crashed images. Crash may be called again;
// it returns the same state.
func (f *FS) Crash() *State {
	f.freezeMu.Lock()
	f.frozen = true
	f.freezeMu.Unlock()
	// Nothing changes the recorded state from here on: the State reads
	// it without locks.
	return &State{root: f.root}
}

// file is one descriptor. node is nil for a directory.
type file struct {
	fsys *FS
	base store.File
	node *fileNode
	name string
	// dsync: opened with O_DSYNC (or O_SYNC), so that each write is
	// durable when it returns, as a write and an fdatasync of its range.
	dsync bool
}

var _ store.File = (*file)(nil)

// recordOp appends a completed operation to the file, numbered now.
func (fl *file) recordOp(op fileOp) error {
	if fl.node == nil {
		return nil
	}
	return fl.fsys.record(opName(op.kind), fl.name, func() {
		fl.node.mu.Lock()
		op.seq = fl.fsys.seq.Add(1)
		fl.node.ops = append(fl.node.ops, op)
		fl.node.mu.Unlock()
	})
}

func opName(k opKind) string {
	switch k {
	case opWrite:
		return "write"
	case opTruncate:
		return "truncate"
	}
	return "fallocate"
}

func (fl *file) ReadAt(p []byte, off int64) (int, error) {
	if fl.fsys.isFrozen() {
		return 0, errFrozen("read", fl.name)
	}
	return fl.base.ReadAt(p, off)
}

// WriteAt records the bytes that reached the file, also when an error cut
// the write short. Through an O_DSYNC descriptor a write that succeeded is
// durable; one that failed is not (its data, or the flush after it, may
// not have reached the disk).
func (fl *file) WriteAt(p []byte, off int64) (int, error) {
	if fl.fsys.isFrozen() {
		return 0, errFrozen("write", fl.name)
	}
	n, err := fl.base.WriteAt(p, off)
	if n > 0 {
		op := fileOp{kind: opWrite, off: off, data: append([]byte(nil), p[:n]...), synced: fl.dsync && err == nil}
		if rerr := fl.recordOp(op); rerr != nil {
			return n, rerr
		}
	}
	return n, err
}

func (fl *file) Truncate(size int64) error {
	if fl.fsys.isFrozen() {
		return errFrozen("truncate", fl.name)
	}
	if err := fl.base.Truncate(size); err != nil {
		return err
	}
	return fl.recordOp(fileOp{kind: opTruncate, size: size})
}

func (fl *file) Fallocate(mode uint32, off, length int64) error {
	if fl.fsys.isFrozen() {
		return errFrozen("fallocate", fl.name)
	}
	if err := fl.base.Fallocate(mode, off, length); err != nil {
		return err
	}
	return fl.recordOp(fileOp{kind: opFallocate, off: off, size: length, mode: mode})
}

// Sync makes durable the file's operations that had completed when it was
// called, if the underlying sync succeeds and the FS has not crashed
// meanwhile. SyncData (fdatasync) and SyncFull (fsync) are alike here: both
// make the data and the size durable, which is all crashfs models of a
// file.
func (fl *file) Sync(mode store.SyncMode) error {
	if fl.fsys.isFrozen() {
		return errFrozen("fsync", fl.name)
	}
	var snap uint64
	if fl.node != nil {
		// Under the file's lock: every operation of this file numbered up
		// to snap is in ops by now.
		fl.node.mu.Lock()
		snap = fl.fsys.seq.Load()
		fl.node.mu.Unlock()
	}
	if err := fl.base.Sync(mode); err != nil {
		return err
	}
	if fl.node == nil {
		return nil
	}
	return fl.fsys.record("fsync", fl.name, func() {
		fl.node.mu.Lock()
		defer fl.node.mu.Unlock()
		covered := fl.node.durable
		for covered < len(fl.node.ops) && fl.node.ops[covered].seq <= snap {
			covered++
		}
		fl.node.durable = covered
	})
}

// WriteBack starts and waits for writeback, which makes nothing durable.
func (fl *file) WriteBack(off, n int64) error {
	if fl.fsys.isFrozen() {
		return errFrozen("sync_file_range", fl.name)
	}
	return fl.base.WriteBack(off, n)
}

func (fl *file) Stat() (store.FileInfo, error) {
	if fl.fsys.isFrozen() {
		return store.FileInfo{}, errFrozen("stat", fl.name)
	}
	return fl.base.Stat()
}

// Extents is the wrapped file's: until the crash, the real file holds
// exactly what completed. After it, the crashed image's own files answer.
func (fl *file) Extents() ([]store.Extent, error) {
	if fl.fsys.isFrozen() {
		return nil, errFrozen("extents", fl.name)
	}
	return fl.base.Extents()
}

// Close closes the descriptor; after Crash it still does, and reports EIO.
func (fl *file) Close() error {
	err := fl.base.Close()
	if fl.fsys.isFrozen() {
		return errFrozen("close", fl.name)
	}
	return err
}

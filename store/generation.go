//go:build linux

package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Generations.
//
// Every file the store holds has a generation (inode.gen): a number that
// moves with every mutation the store acknowledges, through any face
// (Write, a Handle's writes, a store through the file's mapping, appends,
// Truncate, Fallocate, a Rename onto a path, a re-creation), and never
// repeats for a path with other content, across restarts and crashes. A
// crash may move it without a change; nothing moves it back. It is what a
// conditional mutation (Precondition) compares, and what a strong ETag is
// made of.
//
// A generation is a span and a count: span<<genCountBits | count. A span
// belongs to one file, from the moment the store hands it out (genClock)
// for the rest of time: the file's mutations count up within it, one
// atomic add each (inode.bump), and two files never share one. So a path
// never sees a generation twice: within a span values only grow, and
// every other file that comes to the path (re-created, renamed onto it,
// changed from outside while closed, or met after a crash) brings a span
// of its own. A span is replaced by a fresh one halfway through its counts
// (rebase), long before writers in flight could run it out.
//
// Spans are leased durably: a store hands out span numbers from a lease
// that it made durable before handing out the first (and extends the same
// way, leaseSpans at a time). The lease is a name, not a file's bytes:
// StateDir/generation-lease.<first span not leased>, made (an empty file)
// and made durable by an fsync of StateDir, the older one removed after;
// so no file's data need be synced, and a crash between leaves two names,
// of which the larger counts. A store opened later, after a crash too,
// starts past the largest lease. The clock floors the start too (unix
// nanoseconds >> 24, a span number per 16.8 ms), so a lost state
// directory does not send the numbers back to 1, only to the clock.
//
// A closed file keeps its generation when the store can tell that nothing
// changed it: the table keeps, for each file it closed for room, the
// generation with the size and ctime its fstat gave at the close (once the
// ctime has settled: see extentCache), and a file reopened with the same
// ones continues its span (genRecords). Close writes the records of every
// file to StateDir/generation-records, named by the lease then in force
// and ended by their count; a store opened next reads them only if the
// lease it finds is that one and the file is whole, so records written
// before a crash (whose lease the crashed store had moved on from), or
// torn by one, are never believed, and after a crash every file gets a
// new generation. The records file is replaced by a rename, unsynced: if
// a power cut loses it, the files get new generations, which is allowed.
// A file changed from outside while closed changes its ctime, and gets a
// new generation too.

// The parts of a generation, and when a span is replaced.
const (
	genCountBits = 24
	genCountMask = 1<<genCountBits - 1
	// genRebaseAt is the count at which the mutation that reaches it
	// moves the file to a fresh span: half the span, so that the writes
	// in flight meanwhile (up to 8 million) still count within it.
	genRebaseAt = 1 << (genCountBits - 1)
)

// leaseSpans is how many spans one write of the lease promises.
const leaseSpans = 1 << 20

// The state of generations, under StateDir: the lease's name is
// genLeasePrefix and a span number.
const (
	genLeasePrefix = "generation-lease."
	genRecordsFile = StateDir + "/generation-records"
)

// maxGenRecords bounds the records of closed files kept in memory (some
// 100 bytes each): past it one is dropped, and that file gets a new
// generation when it reopens.
const maxGenRecords = 1 << 17

// genClock hands out spans.
type genClock struct {
	fsys FS
	log  *slog.Logger
	// next is the next span to hand out, leaseEnd the first one the lease
	// does not cover. next is advanced atomically; leaseEnd is stored with
	// mu held, after the lease that covers it was written (or failed to
	// be: see warned), and read atomically.
	next, leaseEnd atomic.Int64
	// mu serialises the lease's writes, and guards durable and warned.
	mu sync.Mutex
	// durable is the lease on disk: what Close names its records by; 0 if
	// none was made.
	durable int64
	// warned: the lease could not be made durable, and that was logged.
	warned bool
}

// genRecord is what vouches for a closed file's generation: the size and
// ctime its fstat gave when the store closed it.
type genRecord struct {
	size, ctime int64
	gen         int64
}

// genRecords are the records of the files the store closed, by ID.
type genRecords struct {
	// mu guards byID; a leaf, taken under inodeTable.mu or alone.
	mu   sync.Mutex
	byID map[fileID]genRecord
}

// openGenClock reads the generations' state under StateDir and leases the
// spans the store starts with. It returns the records a store closed in
// order under the lease it found, if that store was the last to run.
func openGenClock(fsys FS, log *slog.Logger) (*genClock, map[fileID]genRecord) {
	c := &genClock{fsys: fsys, log: log}
	found := readLease(fsys)
	var recs map[fileID]genRecord
	if found > 0 {
		recs = readGenRecords(fsys, found)
	}
	start := max(found, time.Now().UnixNano()>>genCountBits, 1)
	c.next.Store(start)
	c.mu.Lock()
	c.durable = found // removed once the next is durable
	c.extendLocked(start)
	c.mu.Unlock()
	return c, recs
}

// first is the first generation of a fresh span.
func (c *genClock) first() int64 {
	sp := c.next.Add(1) - 1
	if sp >= c.leaseEnd.Load() {
		c.mu.Lock()
		if sp >= c.leaseEnd.Load() {
			c.extendLocked(sp)
		}
		c.mu.Unlock()
	}
	return sp<<genCountBits | 1
}

// extendLocked makes a lease that covers span sp and leaseSpans more
// durable before any of them is handed out. If it cannot, it says so once
// (a store opened after a crash could then hand out some of them again,
// down to the clock's floor) and goes on.
//
// Preconditions: c.mu is held.
func (c *genClock) extendLocked(sp int64) {
	end := sp + leaseSpans
	if err := c.writeLease(end); err != nil {
		if !c.warned && c.log != nil {
			c.log.Warn("cannot make the generations' lease durable: after a crash, a file's generation may repeat one given before it (down to the clock's floor)",
				"dir", StateDir, "err", err)
		}
		c.warned = true
		c.durable = 0 // no lease on disk covers the spans handed out now
	} else {
		c.durable = end
	}
	c.leaseEnd.Store(end)
}

// writeLease makes the lease end durable, the name StateDir/
// genLeasePrefix+end, and removes the one before.
//
// Preconditions: c.mu is held.
func (c *genClock) writeLease(end int64) error {
	if err := c.fsys.MkdirAll(StateDir, 0o755); err != nil {
		return err
	}
	f, err := c.fsys.OpenFile(leaseName(end), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	// StateDir, for the name; the root, for StateDir if it was just made
	// (fsync(2) of a directory that is durable already is cheap).
	if err := errors.Join(c.fsys.SyncDir(StateDir), c.fsys.SyncDir(".")); err != nil {
		return err
	}
	if c.durable != 0 {
		c.fsys.Remove(leaseName(c.durable))
	}
	return nil
}

// leaseName is the name of the lease that ends at span end.
func leaseName(end int64) string {
	return StateDir + "/" + genLeasePrefix + strconv.FormatInt(end, 10)
}

// readLease is the largest lease StateDir names, 0 if none; the others are
// left by a crash between a lease and the removal of the one before, and
// removed now.
func readLease(fsys FS) int64 {
	d, err := fsys.OpenDir(StateDir)
	if err != nil {
		return 0
	}
	defer d.Close()
	var leases []int64
	for {
		names, err := d.Names(256)
		for _, n := range names {
			if v, ok := strings.CutPrefix(n, genLeasePrefix); ok {
				if end, err := strconv.ParseInt(v, 10, 64); err == nil && end > 0 {
					leases = append(leases, end)
				}
			}
		}
		if err != nil {
			break
		}
	}
	if len(leases) == 0 {
		return 0
	}
	largest := slices.Max(leases)
	for _, end := range leases {
		if end != largest {
			fsys.Remove(leaseName(end))
		}
	}
	return largest
}

// genRecordsHeader heads the records file, with the lease they belong to;
// genRecordsTrailer ends it, with their count.
const (
	genRecordsHeader  = "filewrite generation records 1 lease "
	genRecordsTrailer = "end "
)

// readGenRecords reads the records file if it was written under lease,
// the lease on disk now (nothing ran after the store that closed in order
// and wrote them), and is whole.
func readGenRecords(fsys FS, lease int64) map[fileID]genRecord {
	b, err := readStateFile(fsys, genRecordsFile)
	if err != nil {
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	if !sc.Scan() || sc.Text() != genRecordsHeader+strconv.FormatInt(lease, 10) {
		return nil
	}
	recs := make(map[fileID]genRecord)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), genRecordsTrailer); ok {
			if n != strconv.Itoa(len(recs)) || sc.Scan() {
				return nil
			}
			return recs
		}
		var id fileID
		var r genRecord
		if _, err := fmt.Sscan(sc.Text(), &id.dev, &id.ino, &r.size, &r.ctime, &r.gen); err != nil || len(recs) == maxGenRecords {
			return nil // torn or foreign: believe none of it
		}
		recs[id] = r
	}
	return nil // no trailer: torn
}

// saveRecords writes recs, the records of every file the store held, to
// the records file under the lease on disk, so that a store opened next
// keeps the generations of the files nothing changes meanwhile. Called by
// Close once every file is closed. It replaces the file by a rename and
// syncs nothing: a store opened after a power cut finds the lease moved on
// or the file torn, and believes none of it, which costs only new
// generations. A failure is logged, not returned: the files get new
// generations when they next open, which a generation may do.
func (c *genClock) saveRecords(recs map[fileID]genRecord) {
	c.mu.Lock()
	lease := c.durable
	c.durable = 0 // once: a second Close has nothing to add
	c.mu.Unlock()
	if lease == 0 {
		return // no lease on disk to name them by
	}
	var b bytes.Buffer
	b.WriteString(genRecordsHeader + strconv.FormatInt(lease, 10) + "\n")
	for id, r := range recs {
		fmt.Fprintf(&b, "%d %d %d %d %d\n", id.dev, id.ino, r.size, r.ctime, r.gen)
	}
	fmt.Fprintf(&b, "%s%d\n", genRecordsTrailer, len(recs))
	tmp := genRecordsFile + ".tmp"
	f, err := c.fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err == nil {
		_, err = f.WriteAt(b.Bytes(), 0)
		err = errors.Join(err, f.Close())
		if err == nil {
			err = c.fsys.Rename(tmp, genRecordsFile, false)
		}
	}
	if err != nil && c.log != nil {
		c.log.Warn("cannot save the files' generations: a store opened next gives every file a new one",
			"file", genRecordsFile, "err", err)
	}
}

func newGenRecords(loaded map[fileID]genRecord) *genRecords {
	if loaded == nil {
		loaded = make(map[fileID]genRecord)
	}
	return &genRecords{byID: loaded}
}

// put keeps the generation of a file being closed, described by fi (its
// fstat after its timestamps were set, just now), unless its ctime has not
// settled (see extentCache): a change from outside right after the close
// could share it.
func (r *genRecords) put(fi FileInfo, gen int64) {
	if !ctimeSettled(fi.Ctime, coarseNow(), coarseTick()) {
		return
	}
	id := fileID{fi.Dev, fi.Ino}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byID[id]; !ok && len(r.byID) >= maxGenRecords {
		for other := range r.byID {
			delete(r.byID, other) // any one: its file gets a new generation
			break
		}
	}
	r.byID[id] = genRecord{size: fi.Size, ctime: fi.Ctime, gen: gen}
}

// take returns and forgets the record of the file fi describes (its fstat
// at open), if the file is as the record says.
func (r *genRecords) take(fi FileInfo) (int64, bool) {
	id := fileID{fi.Dev, fi.Ino}
	r.mu.Lock()
	rec, ok := r.byID[id]
	delete(r.byID, id)
	r.mu.Unlock()
	if !ok || rec.size != fi.Size || rec.ctime != fi.Ctime || rec.gen&genCountMask >= genRebaseAt {
		return 0, false
	}
	return rec.gen, true
}

// forget drops the record of file id: its last name is gone, and the
// kernel may give its inode number to the next file created.
func (r *genRecords) forget(id fileID) {
	r.mu.Lock()
	delete(r.byID, id)
	r.mu.Unlock()
}

// snapshot copies the records.
func (r *genRecords) snapshot() map[fileID]genRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[fileID]genRecord, len(r.byID))
	for id, rec := range r.byID {
		m[id] = rec
	}
	return m
}

// initGen gives ino, opened as fi describes, its generation: the one it
// had when the store last closed it, if nothing changed it since, or the
// first of a fresh span.
func (ino *inode) initGen(t *inodeTable, fi FileInfo) {
	if g, ok := t.genRecords.take(fi); ok {
		ino.gen.Store(g)
		return
	}
	ino.gen.Store(t.gens.first())
}

// bump moves ino's generation for a mutation and returns the new one: one
// atomic add, and a fresh span for the mutation that reaches genRebaseAt.
//
// Preconditions: the mutation is done and still holds the inode lock, in
// some mode, or is counted in flight, so that a conditional mutation
// (which holds the lock exclusively with no write in flight) sees both or
// neither.
func (ino *inode) bump() int64 {
	g := ino.gen.Add(1)
	if g&genCountMask == genRebaseAt {
		return ino.rebase(g)
	}
	return g
}

// genAfter is the generation after a write that put n bytes in the file:
// moved (bump) if n > 0.
//
// Preconditions: bump's.
func (ino *inode) genAfter(n int) int64 {
	if n > 0 {
		return ino.bump()
	}
	return ino.gen.Load()
}

// rebase moves ino, whose generation reached genRebaseAt at g, to a fresh
// span, and returns the mutation's generation: the fresh one if no other
// mutation counted meanwhile, else g (the file's then moves on to the
// fresh span without a mutation of its own, which a generation may do).
func (ino *inode) rebase(g int64) int64 {
	next := ino.table.gens.first()
	if ino.gen.CompareAndSwap(g, next) {
		return next
	}
	for {
		cur := ino.gen.Load()
		if cur>>genCountBits != g>>genCountBits || ino.gen.CompareAndSwap(cur, next) {
			return g
		}
	}
}

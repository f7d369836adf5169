//go:build linux

package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// appendJournal keeps the append-ID window (appendIDWindow) on disk, so
// that a store opened after its process was killed still knows where the
// appends it was told about landed, and a resend of one lands once.
//
// Each append that carries an ID writes one record (its path, ID, offset,
// length, the CRC-32C of its data and the time of its claim) once its
// range is reserved and before its bytes are written: a kill between the
// two leaves a record whose bytes never landed, which the resend finds out
// (appendOnce checks the bytes) and appends afresh. A record is one
// pwrite(2) at an offset mu hands out, not synced: the page cache outlives
// a killed process, not a power cut. An append that fails after its record
// was written writes a second one that forgets it.
//
// Records go to numbered generations, StateDir/appends.<n>. Once the
// current one holds perGen records (the window's count), the next is
// created and the one before the current is removed, so the two on disk
// always hold at least the last perGen records: no fewer than the window
// remembers. Open loads them all; the first record after Open goes on in
// the newest one.
//
// Like the rest of the store, it works through the FS seam. If StateDir
// cannot be made or a generation cannot be opened or written (a read-only
// root, a file named StateDir), the store logs it (Options.Logger) and
// goes on with the IDs in memory only: appends without an ID never touch
// the journal, and those with one are made as before, remembered for the
// process's life.
type appendJournal struct {
	fsys   FS
	perGen int
	log    *slog.Logger

	// rotateMu serialises opening, rotating and closing, which create and
	// remove generations; held across that I/O, taken before mu.
	rotateMu sync.Mutex

	// mu guards the fields below; a leaf, never held across I/O. It hands
	// out the current generation's offsets.
	mu    sync.Mutex
	state journalState
	// cur is the generation records go to; nil unless state is
	// journalOpen.
	cur *journalGen
	// prev is the generation before cur, removed at the next rotation;
	// nil if none.
	prev *journalGen
	// loaded are the generations Open found, oldest first; open goes on
	// in the last and removes all but the last two.
	loaded []*journalGen
	// rotating is set while a rotation creates the next generation.
	rotating bool
	// warned says a failure was logged; later ones are not.
	warned bool
}

type journalState int

const (
	journalUnopened journalState = iota // no record written since Open
	journalOpen                         // cur takes records
	journalOff                          // broken or closed: memory only
)

// journalGen is one generation file.
type journalGen struct {
	num uint64
	// file is nil for a generation loaded and not written to.
	file File
	// end, count and rotateAt are guarded by appendJournal.mu: the next
	// record's offset, the records in the file, and the count at which
	// the next generation starts.
	end      int64
	count    int
	rotateAt int
	// writers counts the records being written to file, which is closed
	// once none is.
	writers sync.WaitGroup
}

func (g *journalGen) name() string { return journalName(g.num) }

func journalName(num uint64) string {
	return StateDir + "/" + journalPrefix + strconv.FormatUint(num, 10)
}

const journalPrefix = "appends."

// journalRecord is one record of the journal.
type journalRecord struct {
	forget bool  // the append failed: forget an earlier record of the key
	at     int64 // the claim's wall-clock time, in Unix nanoseconds
	off, n int64
	crc    uint32 // CRC-32C of the append's data
	path   string
	id     string
}

// The record format, little-endian, each record padded with zeros to a
// multiple of journalAlign so that a reader can find the next one past a
// damaged one (a kill between an offset being handed out and its pwrite
// leaves zeros, or nothing, while records after it landed):
//
//	magic   uint32  journalMagic
//	bodyLen uint32  the bytes of body
//	bodyCRC uint32  CRC-32C of body
//	body:
//	  kind    uint8   1 an append, 2 a forget
//	  idLen   uint8
//	  pathLen uint16
//	  at      int64   Unix nanoseconds
//	  off     int64
//	  n       int64
//	  dataCRC uint32
//	  path, id
const (
	journalMagic     = 0x314a5746 // "FWJ1"
	journalHeader    = 12
	journalFixedBody = 32
	journalAlign     = 8
	journalMaxBody   = journalFixedBody + MaxPathLen + MaxAppendIDLen

	journalKindAppend = 1
	journalKindForget = 2
)

// journalAligned rounds n up to a multiple of journalAlign: a record's
// size with its padding, and where the next record may start.
func journalAligned[T int | int64](n T) T {
	return (n + journalAlign - 1) / journalAlign * journalAlign
}

func (r journalRecord) encode() []byte {
	bodyLen := journalFixedBody + len(r.path) + len(r.id)
	b := make([]byte, journalAligned(journalHeader+bodyLen))
	body := b[journalHeader : journalHeader+bodyLen]
	body[0] = journalKindAppend
	if r.forget {
		body[0] = journalKindForget
	}
	body[1] = byte(len(r.id))
	binary.LittleEndian.PutUint16(body[2:], uint16(len(r.path)))
	binary.LittleEndian.PutUint64(body[4:], uint64(r.at))
	binary.LittleEndian.PutUint64(body[12:], uint64(r.off))
	binary.LittleEndian.PutUint64(body[20:], uint64(r.n))
	binary.LittleEndian.PutUint32(body[28:], r.crc)
	copy(body[journalFixedBody:], r.path)
	copy(body[journalFixedBody+len(r.path):], r.id)
	binary.LittleEndian.PutUint32(b[0:], journalMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(bodyLen))
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(body, castagnoli))
	return b
}

// decodeJournal returns the records of one generation's bytes, in order.
// What is not a whole record with its CRC (a kill mid-record, a record
// whose pwrite never came, a power cut's garbage) is skipped, one
// alignment unit at a time, to the next record that is.
func decodeJournal(b []byte) []journalRecord {
	var recs []journalRecord
	for pos := 0; pos+journalHeader+journalFixedBody <= len(b); {
		r, size, ok := decodeRecord(b[pos:])
		if !ok {
			pos += journalAlign
			continue
		}
		recs = append(recs, r)
		pos += size
	}
	return recs
}

// decodeRecord decodes the record at the start of b and says how many
// bytes it takes, padding included.
func decodeRecord(b []byte) (journalRecord, int, bool) {
	if binary.LittleEndian.Uint32(b[0:]) != journalMagic {
		return journalRecord{}, 0, false
	}
	bodyLen := int(binary.LittleEndian.Uint32(b[4:]))
	if bodyLen < journalFixedBody || bodyLen > journalMaxBody || journalHeader+bodyLen > len(b) {
		return journalRecord{}, 0, false
	}
	body := b[journalHeader : journalHeader+bodyLen]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return journalRecord{}, 0, false
	}
	idLen, pathLen := int(body[1]), int(binary.LittleEndian.Uint16(body[2:]))
	if journalFixedBody+pathLen+idLen != bodyLen || (body[0] != journalKindAppend && body[0] != journalKindForget) {
		return journalRecord{}, 0, false
	}
	r := journalRecord{
		forget: body[0] == journalKindForget,
		at:     int64(binary.LittleEndian.Uint64(body[4:])),
		off:    int64(binary.LittleEndian.Uint64(body[12:])),
		n:      int64(binary.LittleEndian.Uint64(body[20:])),
		crc:    binary.LittleEndian.Uint32(body[28:]),
		path:   string(body[journalFixedBody : journalFixedBody+pathLen]),
		id:     string(body[journalFixedBody+pathLen:]),
	}
	return r, min(journalAligned(journalHeader+bodyLen), len(b)), true
}

// loadAppendJournal reads the generations under StateDir, oldest first,
// and returns the journal over them (written to from the first record on)
// and their records in the order they were written. A journal it cannot
// read is logged and left alone: the store starts with no IDs remembered.
func loadAppendJournal(fsys FS, perGen int, log *slog.Logger) (*appendJournal, []journalRecord) {
	j := &appendJournal{fsys: fsys, perGen: perGen, log: log}
	d, err := fsys.OpenDir(StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		j.warn("read the append-ID journal", err)
		return j, nil
	}
	var nums []uint64
	for {
		names, err := d.Names(1024)
		for _, n := range names {
			if num, err := strconv.ParseUint(strings.TrimPrefix(n, journalPrefix), 10, 64); err == nil && strings.HasPrefix(n, journalPrefix) {
				nums = append(nums, num)
			}
		}
		if err != nil || len(names) == 0 {
			if !errors.Is(err, io.EOF) && err != nil {
				j.warn("read the append-ID journal", err)
			}
			break
		}
	}
	d.Close()
	slices.Sort(nums)
	var recs []journalRecord
	for _, num := range nums {
		g := &journalGen{num: num, rotateAt: perGen}
		b, err := readStateFile(fsys, g.name())
		if err != nil {
			j.warn("read the append-ID journal", err)
		}
		gr := decodeJournal(b)
		g.count = len(gr)
		recs = append(recs, gr...)
		j.loaded = append(j.loaded, g)
	}
	return j, recs
}

// add writes r to the current generation, opening the journal first if
// no record was written since Open, and starts the next generation when
// the current one is full. A failure is logged; the append goes on.
func (j *appendJournal) add(r journalRecord) {
	b := r.encode()
	j.mu.Lock()
	if j.state == journalUnopened {
		j.mu.Unlock()
		j.open()
		j.mu.Lock()
	}
	g := j.cur
	if j.state != journalOpen {
		j.mu.Unlock()
		return
	}
	off := g.end
	g.end += int64(len(b))
	g.count++
	rotate := g.count >= g.rotateAt && !j.rotating
	if rotate {
		j.rotating = true
	}
	g.writers.Add(1)
	j.mu.Unlock()

	_, err := g.file.WriteAt(b, off)
	g.writers.Done()
	if err != nil {
		j.warn("write the append-ID journal", err)
	}
	if rotate {
		j.rotate(g)
	}
}

// open makes StateDir and goes on in the newest generation Open loaded
// (past its end, aligned), or creates the first; generations older than
// the one before it are removed.
func (j *appendJournal) open() {
	j.rotateMu.Lock()
	defer j.rotateMu.Unlock()
	j.mu.Lock()
	if j.state != journalUnopened {
		j.mu.Unlock()
		return
	}
	loaded := j.loaded
	j.loaded = nil
	j.mu.Unlock()

	var cur, prev *journalGen
	var stale []*journalGen
	err := j.fsys.MkdirAll(StateDir, 0o755)
	if err == nil {
		if len(loaded) > 0 {
			cur = loaded[len(loaded)-1]
			if len(loaded) > 1 {
				prev = loaded[len(loaded)-2]
				stale = loaded[:len(loaded)-2]
			}
		} else {
			cur = &journalGen{num: 1, rotateAt: j.perGen}
		}
		err = j.openGen(cur)
	}
	j.mu.Lock()
	if err != nil {
		j.state = journalOff
	} else {
		j.state, j.cur, j.prev = journalOpen, cur, prev
	}
	j.mu.Unlock()
	if err != nil {
		j.warn("open the append-ID journal", err)
		return
	}
	for _, g := range stale {
		j.remove(g)
	}
}

// openGen opens (creating it if missing) g's file for records past its
// end.
func (j *appendJournal) openGen(g *journalGen) error {
	f, err := j.fsys.OpenFile(g.name(), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	g.file = f
	g.end = journalAligned(fi.Size)
	return nil
}

// rotate starts the generation after full, which became full: the one
// before full is removed once its last record is written.
func (j *appendJournal) rotate(full *journalGen) {
	j.rotateMu.Lock()
	defer j.rotateMu.Unlock()
	next := &journalGen{num: full.num + 1, rotateAt: j.perGen}
	err := j.openGen(next)
	j.mu.Lock()
	j.rotating = false
	if err != nil || j.state != journalOpen || j.cur != full {
		// Try again a generation's worth of records later; a closed
		// journal takes no generation.
		full.rotateAt = full.count + j.perGen
		j.mu.Unlock()
		if err != nil {
			j.warn("rotate the append-ID journal", err)
		} else {
			next.file.Close()
		}
		return
	}
	old := j.prev
	j.prev, j.cur = full, next
	j.mu.Unlock()
	if old != nil {
		j.remove(old)
	}
}

// remove closes g's file once its writers are done, and removes it.
func (j *appendJournal) remove(g *journalGen) {
	g.writers.Wait()
	if g.file != nil {
		g.file.Close()
	}
	if err := j.fsys.Remove(g.name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		j.warn("remove an old generation of the append-ID journal", err)
	}
}

// close syncs the generations and their directory (and the root, which
// holds StateDir), so that a store stopped in order keeps its IDs across
// a power cut too, and closes the files. Records written after it are
// dropped.
func (j *appendJournal) close() error {
	j.rotateMu.Lock()
	defer j.rotateMu.Unlock()
	j.mu.Lock()
	cur, prev := j.cur, j.prev
	j.state, j.cur, j.prev = journalOff, nil, nil
	j.mu.Unlock()
	if cur == nil {
		return nil // never opened: nothing written
	}
	var errs []error
	for _, g := range []*journalGen{prev, cur} {
		if g == nil || g.file == nil {
			continue
		}
		g.writers.Wait()
		errs = append(errs, g.file.Sync(SyncData), g.file.Close())
	}
	errs = append(errs, j.fsys.SyncDir(StateDir), j.fsys.SyncDir("."))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close the append-ID journal: %w", err)
	}
	return nil
}

// warn logs the journal's first failure: from then on the IDs it could
// not keep are in memory only.
func (j *appendJournal) warn(what string, err error) {
	j.mu.Lock()
	warned := j.warned
	j.warned = true
	j.mu.Unlock()
	if !warned && j.log != nil {
		j.log.Warn("cannot "+what+": append IDs it does not hold are remembered in memory only, and a resend of such an append after a restart may land twice",
			"dir", StateDir, "err", err)
	}
}

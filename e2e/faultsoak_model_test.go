package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
)

// The fault soak's model: what the daemon acknowledged, and so what each
// byte of its files may hold when the daemon is down. SIGKILL ends the
// process, not the machine, so every acknowledged write must be on disk
// after it, synced or not (a write through the daemon's file mapping as
// much as a pwrite: both are in the page cache); the synced ones are
// counted apart, as what a power cut could not take either.

// soakSlot is a byte range of a slot file that one writer owns and
// rewrites, one version at a time: version v fills it with the slot's
// pattern for v (slotPattern). Versions count from 1, so a slot never
// written, or cut away from outside, reads as zeros, which no version is.
type soakSlot struct {
	file string
	off  int64
	size int
	id   uint32

	// Guarded by soakModel.mu.

	// sent is the last version sent. The slot may hold any version of
	// [floor, sent], or zeros while zeros is set: the last acknowledged
	// one, and those sent after it whose outcome is unknown (in flight,
	// failed, or cut short by the kill).
	sent, floor uint32
	zeros       bool
	// sentEpoch is the file's cut epoch when sent was sent: an ack of
	// it that comes after a cut raises no floor, as the write may have
	// landed before the cut and been cut away with the rest.
	sentEpoch uint64
	// synced is the last version acknowledged durable.
	synced uint32
}

// slotPattern is version v of slot id: the slot's id and the version,
// each mixed with a constant so that few of their bytes are 0, repeated.
// A byte of it tells which version it came from, even in a write that
// landed in part.
func slotPattern(id, v uint32, size int) []byte {
	var unit [8]byte
	patternUnit(&unit, id, v)
	return bytes.Repeat(unit[:], size/8+1)[:size]
}

func patternUnit(unit *[8]byte, id, v uint32) {
	binary.BigEndian.PutUint32(unit[:4], id^0xa5c3e1f7)
	binary.BigEndian.PutUint32(unit[4:], v^0x5b3d1f79)
}

// soakAppend is an append the daemon acknowledged: its record is at off.
type soakAppend struct {
	file   string
	off    int64
	record []byte
	synced bool
}

// soakModel holds every slot and acknowledged append. mu is never held
// across a call to the daemon, only across a cut (soakModel.cut), so
// that a write is sent either before a cut or after it.
type soakModel struct {
	mu      sync.Mutex
	slots   []*soakSlot            // set before the soak; each slot's state guarded by mu
	epochs  map[string]uint64      // cuts of each slot file so far; guarded by mu
	appends []soakAppend           // guarded by mu
	files   map[string][]*soakSlot // the slots of each file; set before the soak
}

func newSoakModel() *soakModel {
	return &soakModel{epochs: map[string]uint64{}, files: map[string][]*soakSlot{}}
}

// addFiles adds files of n slots each, slot i of slotSize(i) bytes, one
// after the other from offset 0, and returns their slots. Only before the
// soak starts.
func (m *soakModel) addFiles(files []string, n int, slotSize func(i int) int) []*soakSlot {
	var added []*soakSlot
	for _, f := range files {
		var off int64
		for i := range n {
			s := &soakSlot{file: f, off: off, size: slotSize(i), id: uint32(len(m.slots) + 1), zeros: true}
			off += int64(s.size)
			m.slots = append(m.slots, s)
			m.files[f] = append(m.files[f], s)
			added = append(added, s)
		}
	}
	return added
}

// send records that the next version of s is about to be sent, and
// returns it with its bytes.
func (m *soakModel) send(s *soakSlot) (uint32, []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.sent++
	s.sentEpoch = m.epochs[s.file]
	return s.sent, slotPattern(s.id, s.sent, s.size)
}

// acked records that version v of s was acknowledged, durable or not.
func (m *soakModel) acked(s *soakSlot, v uint32, durable bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v != s.sent || s.sentEpoch != m.epochs[s.file] {
		// A cut came between the send and the ack: v is allowed, as
		// all sent are, but so are zeros and what came before.
		return
	}
	s.floor, s.zeros = v, false
	if durable {
		s.synced = v
	}
}

// syncedUpTo records that every version of s acknowledged so far is
// durable (an Fsync returned).
func (m *soakModel) syncedUpTo(s *soakSlot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.floor > 0 && !s.zeros {
		s.synced = s.floor
	}
}

// appended records an acknowledged append.
func (m *soakModel) appended(a soakAppend) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.appends = append(m.appends, a)
}

// cut truncates file to size from outside the daemon, with truncate, and
// records it: every slot that reached past size may read as zeros from
// now on. No write of the file is sent while it cuts.
func (m *soakModel) cut(file string, size int64, truncate func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := truncate(); err != nil {
		return err
	}
	m.epochs[file]++
	for _, s := range m.files[file] {
		if s.off+int64(s.size) > size {
			s.zeros = true
		}
	}
	return nil
}

// soakCheck is what a check of the files against the model found.
type soakCheck struct {
	bytes, synced int64    // bytes of acknowledged versions checked, and of those durable
	problems      []string // the first few
	bad           int      // slots and appends that do not hold what they may
}

// check compares the files, read by read (nil for a missing file, as if
// empty), with what they may hold. The daemon must be down: no write may
// land meanwhile.
func (m *soakModel) check(read func(file string) []byte) soakCheck {
	m.mu.Lock()
	defer m.mu.Unlock()
	var c soakCheck
	contents := map[string][]byte{}
	get := func(f string) []byte {
		b, ok := contents[f]
		if !ok {
			b = read(f)
			contents[f] = b
		}
		return b
	}
	for _, s := range m.slots {
		data := get(s.file)
		if s.floor > 0 && !s.zeros {
			c.bytes += int64(s.size)
			if s.synced == s.floor {
				c.synced += int64(s.size)
			}
		}
		if at, ok := s.allows(data); !ok {
			c.fail("%s [%d, +%d) slot %d: byte %d is %#x, which no version in [%d, %d] holds there (zeros allowed: %v)",
				s.file, s.off, s.size, s.id, at, byteAt(data, s.off+int64(at)), s.floor, s.sent, s.zeros)
		}
	}
	for _, a := range m.appends {
		data := get(a.file)
		end := a.off + int64(len(a.record))
		if end > int64(len(data)) || !bytes.Equal(data[a.off:end], a.record) {
			c.fail("%s: the append acknowledged at %d is not there", a.file, a.off)
			continue
		}
		c.bytes += int64(len(a.record))
		if a.synced {
			c.synced += int64(len(a.record))
		}
	}
	return c
}

func (c *soakCheck) fail(format string, args ...any) {
	if c.bad++; c.bad <= 8 {
		c.problems = append(c.problems, fmt.Sprintf(format, args...))
	}
}

// allows reports whether data, the slot's file, holds in the slot a mix
// of what it may hold, byte by byte (a write cut short by the kill, or by
// a full disk, lands in part), and if not the first byte that it may not.
//
// Preconditions: soakModel.mu is held.
func (s *soakSlot) allows(data []byte) (int, bool) {
	for i := range s.size {
		b := byteAt(data, s.off+int64(i))
		if b == 0 && s.zeros {
			continue
		}
		ok := false
		for v := max(s.floor, 1); v <= s.sent && !ok; v++ {
			ok = b == patternByte(s.id, v, i)
		}
		if !ok {
			return i, false
		}
	}
	return 0, true
}

// patternByte is byte i of slotPattern(id, v, ...).
func patternByte(id, v uint32, i int) byte {
	var unit [8]byte
	patternUnit(&unit, id, v)
	return unit[i%8]
}

// byteAt is data[off], or 0 past its end (a file cut short reads so).
func byteAt(data []byte, off int64) byte {
	if off >= int64(len(data)) {
		return 0
	}
	return data[off]
}

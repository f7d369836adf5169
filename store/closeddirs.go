//go:build linux

package store

import "maps"

// closedDirs holds, by file, the pending directories (inode.pendingDirs)
// of the files the table closed while idle before a sync made their names
// durable (inodeTable.unsyncedDirs). A service that creates many files
// and does not sync them keeps one record per file, for as long as the
// daemon runs: 100,000 of them, each a record, a slice and the name its
// strings point into, were a third of the daemon's memory and most of the
// collector's marking. Here a record is an index and a stamp, in a map the
// collector does not scan, and the files of one directory share one list
// of directories, counted, and dropped with its last file.
//
// It is guarded by inodeTable.mu.
type closedDirs struct {
	byID map[fileID]closedDirRecord
	// lists are the distinct lists of directories, by slot; byKey finds a
	// list's slot by its directories, joined (dirsKey). Freed slots are
	// reused first.
	lists []dirList
	byKey map[string]int32
	free  []int32
}

// closedDirRecord is a dirRecord whose directories are lists[list].
type closedDirRecord struct {
	list  int32
	since int64
}

// dirList is one list of directories and the records that use it.
type dirList struct {
	dirs []string
	key  string
	refs int
}

func newClosedDirs() *closedDirs {
	return &closedDirs{byID: make(map[fileID]closedDirRecord), byKey: make(map[string]int32)}
}

// dirsKey is the key of dirs in byKey, built in buf: directory names hold
// no NUL.
func dirsKey(buf []byte, dirs []string) []byte {
	for i, d := range dirs {
		if i > 0 {
			buf = append(buf, 0)
		}
		buf = append(buf, d...)
	}
	return buf
}

// put keeps rec as the record of id, replacing any.
func (c *closedDirs) put(id fileID, rec *dirRecord) {
	c.forget(id)
	var buf [256]byte
	key := dirsKey(buf[:0], rec.dirs)
	i, ok := c.byKey[string(key)] // no allocation for the lookup
	if !ok {
		l := dirList{dirs: rec.dirs, key: string(key)}
		if n := len(c.free); n > 0 {
			i, c.free = c.free[n-1], c.free[:n-1]
			c.lists[i] = l
		} else {
			i = int32(len(c.lists))
			c.lists = append(c.lists, l)
		}
		c.byKey[l.key] = i
	}
	c.lists[i].refs++
	c.byID[id] = closedDirRecord{list: i, since: rec.since}
}

// take removes the record of id and returns it, or nil if there is none.
func (c *closedDirs) take(id fileID) *dirRecord {
	r, ok := c.byID[id]
	if !ok {
		return nil
	}
	rec := &dirRecord{dirs: c.lists[r.list].dirs, since: r.since}
	c.forget(id)
	return rec
}

// forget drops the record of id, if any, and its list with its last record.
func (c *closedDirs) forget(id fileID) {
	r, ok := c.byID[id]
	if !ok {
		return
	}
	delete(c.byID, id)
	l := &c.lists[r.list]
	if l.refs--; l.refs == 0 {
		delete(c.byKey, l.key)
		*l = dirList{}
		c.free = append(c.free, r.list)
	}
}

// has reports whether id has a record.
func (c *closedDirs) has(id fileID) bool {
	_, ok := c.byID[id]
	return ok
}

// dirLists lists the directories of the records, each list once.
func (c *closedDirs) dirLists() [][]string {
	dirs := make([][]string, 0, len(c.byKey))
	for _, i := range c.byKey {
		dirs = append(dirs, c.lists[i].dirs)
	}
	return dirs
}

// snapshot lists every record's directories, and the records, so that a
// caller can sync them without the table's lock and then forget those
// that did not change meanwhile (forgetIf).
func (c *closedDirs) snapshot() (dirs [][]string, records map[fileID]closedDirRecord) {
	return c.dirLists(), maps.Clone(c.byID)
}

// forgetIf forgets the records of snapshot that are still as they were: a
// file reopened and renamed meanwhile has a new record, which stays.
func (c *closedDirs) forgetIf(records map[fileID]closedDirRecord) {
	for id, r := range records {
		if cur, ok := c.byID[id]; ok && cur == r {
			c.forget(id)
		}
	}
}

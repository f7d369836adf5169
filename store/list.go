//go:build linux

package store

import (
	"container/heap"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Page sizes of List.
const (
	// DefaultListPageSize is the page size of a request that gives none (0).
	DefaultListPageSize = 1000
	// MaxListPageSize is the largest page size a request may ask for; larger is
	// ErrInvalidPage.
	MaxListPageSize = 10000
)

// listChunk is how many names List reads from the directory at once.
const listChunk = 1024

// DirEntry is one entry of a directory, as List returns it. Entries are
// described as they are (lstat): a symlink is neither a directory nor
// sized, whatever it names.
type DirEntry struct {
	Name  string
	IsDir bool
	// Size is a regular file's size in bytes; 0 for anything else.
	Size int64
}

// List returns the entries of directory dir ("" is the root) in byte-wise
// name order, at most pageSize of them (0 means DefaultListPageSize), starting
// after the name that pageToken encodes ("" for the first page), and the
// token of the next page, "" after the last one.
//
// A page token encodes the last name returned, so it stays valid while
// entries are added and removed: resuming after a name, every entry that
// exists from the first page to the last is returned exactly once; an
// entry added or removed meanwhile may or may not be.
//
// Memory is bounded by the page, not the directory: each page reads every
// name of the directory in chunks of listChunk, keeping the pageSize
// smallest names past the token in a heap, and stats only those. Listing
// a directory of n entries whole costs O(n²/pageSize) names read.
//
// A name that is not valid UTF-8 (made outside the store) is left out:
// no path the store accepts can name it, a protobuf string cannot carry
// it, and an escaped form would name another file, or none. It is
// logged to Options.Logger once. StateDir, at the root, is left out too.
//
// It makes nothing durable and takes no inode lock: files being written
// show the size they have at that moment.
func (s *Store) List(ctx context.Context, dir string, pageSize int, pageToken string) ([]DirEntry, string, error) {
	name := dir
	if dir == "" {
		name = "."
	} else if err := validatePath(dir); err != nil {
		return nil, "", err
	}
	switch {
	case pageSize == 0:
		pageSize = DefaultListPageSize
	case pageSize < 0 || pageSize > MaxListPageSize:
		return nil, "", refuseLimit(ErrInvalidPage, "page_size", MaxListPageSize, "page size %d, want 1 to %d (0 for %d)", pageSize, MaxListPageSize, DefaultListPageSize)
	}
	after, err := decodePageToken(pageToken)
	if err != nil {
		return nil, "", err
	}
	d, err := s.fsys.OpenDir(name)
	if err != nil {
		return nil, "", listError(dir, err)
	}
	defer d.Close()

	page := make(nameHeap, 0, min(pageSize, listChunk))
	more := false // a name past the token did not fit in the page
	for {
		if err := ctx.Err(); err != nil {
			return nil, "", err
		}
		names, err := d.Names(listChunk)
		for _, n := range names {
			switch {
			case !utf8.ValidString(n):
				s.unlisted.report(s.opts.Logger, name, n)
			case dir == "" && n == StateDir:
				// The store's own state: no path reaches it.
			case n <= after:
			case len(page) < pageSize:
				heap.Push(&page, n)
			case n < page[0]:
				page[0] = n
				heap.Fix(&page, 0)
				more = true
			default:
				more = true
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			break
		}
		if err != nil {
			return nil, "", listError(dir, err)
		}
	}

	names := []string(page)
	slices.Sort(names)
	entries := make([]DirEntry, 0, len(names))
	var regular []int // indices of regular files in entries
	for _, n := range names {
		fi, err := d.Lstat(n)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since it was read: it was not there throughout
		}
		if err != nil {
			return nil, "", listError(dir+"/"+n, err)
		}
		e := DirEntry{Name: n, IsDir: fi.IsDir}
		if fi.Type.IsRegular() {
			e.Size = fi.Size
			regular = append(regular, len(entries))
		}
		entries = append(entries, e)
	}
	// After every lstat(2): inodeTable.mu is never held across I/O.
	s.table.visibleSizes(dir, entries, regular)
	next := ""
	if more {
		next = encodePageToken(names[len(names)-1])
	}
	return entries, next, nil
}

// nameHeap is a max-heap of names: page[0] is the largest kept, the first
// to give way to a smaller one.
type nameHeap []string

func (h nameHeap) Len() int           { return len(h) }
func (h nameHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h nameHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nameHeap) Push(x any)        { *h = append(*h, x.(string)) }
func (h *nameHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// pageTokenPrefix versions the token, so that its form can change and a
// token made up by a client is told from one List gave.
const pageTokenPrefix = "n1:"

func encodePageToken(last string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + last))
}

// decodePageToken returns the name after which a page starts; "" (before
// every name) for the empty token.
func decodePageToken(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	name, ok := strings.CutPrefix(string(b), pageTokenPrefix)
	if err != nil || !ok || name == "" || strings.ContainsAny(name, "/\x00") {
		return "", refuse(ErrInvalidPage, "page_token", "page token %q was not returned by List", tok)
	}
	return name, nil
}

// maxUnlistedReports bounds the names unlistedNames remembers, and so
// reports: a directory of a million such names costs the store no more.
const maxUnlistedReports = 1024

// unlistedNames remembers the names List left out and logged, so that
// each is logged once however often it is listed.
type unlistedNames struct {
	// mu guards seen; a leaf, never held across the report.
	mu   sync.Mutex
	seen map[string]struct{}
}

// report logs to log (if not nil) that List of dir left name out, unless
// it did before or maxUnlistedReports names were reported already.
func (u *unlistedNames) report(log *slog.Logger, dir, name string) {
	if log == nil {
		return
	}
	key := path.Join(dir, name)
	u.mu.Lock()
	_, seen := u.seen[key]
	full := len(u.seen) >= maxUnlistedReports
	if !seen && !full {
		if u.seen == nil {
			u.seen = make(map[string]struct{})
		}
		u.seen[key] = struct{}{}
	}
	u.mu.Unlock()
	if !seen && !full {
		// Quoted: the name is not valid UTF-8, and a log line must be.
		log.Warn("List leaves out a name that is not valid UTF-8 (made outside the daemon: no request can name it)",
			"dir", dir, "name", strconv.Quote(name))
	}
}

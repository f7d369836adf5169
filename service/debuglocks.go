package service

import (
	"cmp"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// Bounds of /debug/locks: how many open files it looks at, and how many it
// lists (?limit=N may ask for fewer). The store lists at most 16 holders
// and the first 16 waiters of each file.
const (
	debugLocksScan  = 10000
	debugLocksLimit = 1000
)

// debugLocks is GET /debug/locks: each open file with its size, the
// holders of its inode lock and the first callers waiting for it (mode,
// operation, reason, since when, trace and span id), how many wait in all,
// and how many writes run in flight. Files with holders, waiters or writes
// in flight come first, then by path. JSON unless the client prefers
// text/html (a browser), then a page that refreshes itself; ?format=json
// or ?format=html overrides the Accept header, and ?limit=N lists at most
// N files.
//
// It is off the hot path: the store copies each file's lock state under
// that lock's own short mutex, so a request in flight waits at most for a
// copy, never for this handler's encoding.
type debugLocks struct {
	store *store.Store
	// traceURL is --trace-url-template: where the page links a trace id
	// to, "" for no links.
	traceURL string
}

// locksReport is the JSON body of /debug/locks.
type locksReport struct {
	Time time.Time `json:"time"`
	// OpenFiles is how many open files were looked at (at most
	// debugLocksScan), Shown how many are listed.
	OpenFiles int  `json:"open_files"`
	Shown     int  `json:"shown"`
	Truncated bool `json:"truncated"`
	// Note says what was left out, when something was.
	Note  string            `json:"note,omitempty"`
	Files []store.FileLocks `json:"files"`
}

func (d *debugLocks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	limit := debugLocksLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > debugLocksLimit {
			status.WriteHTTP(w, http.StatusBadRequest, status.NewRefusal(filewritev1.ErrorReason_PAGE_INVALID,
				map[string]string{errorinfo.KeyField: "limit", errorinfo.KeyLimit: strconv.Itoa(debugLocksLimit)},
				fmt.Sprintf("limit %q: want 1 to %d", v, debugLocksLimit)))
			return
		}
		limit = n
	}
	rep := buildLocksReport(d.store.Locks(debugLocksScan), limit, time.Now())
	w.Header().Set("Cache-Control", "no-store")
	asHTML := prefersHTML(r.Header.Get("Accept"))
	switch f := r.URL.Query().Get("format"); f {
	case "":
	case "json", "html":
		asHTML = f == "html"
	default:
		status.WriteHTTP(w, http.StatusBadRequest, status.NewRefusal(filewritev1.ErrorReason_REQUEST_MALFORMED,
			map[string]string{errorinfo.KeyField: "format"}, fmt.Sprintf("format %q: want json or html", f)))
		return
	}
	if asHTML {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// The page runs its own script and style and nothing else; it
		// names files and operations that callers chose.
		w.Header().Set("Content-Security-Policy", locksPagePolicy)
		if err := locksPage.Execute(w, locksPageData{locksReport: rep, traceURL: d.traceURL}); err != nil {
			// The status is sent; all that is left is to stop.
			return
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

// buildLocksReport orders files busy first, then by path, and keeps limit.
func buildLocksReport(files []store.FileLocks, limit int, now time.Time) locksReport {
	for i := range files {
		// [] rather than null in JSON
		if files[i].Holders == nil {
			files[i].Holders = []store.HolderInfo{}
		}
		if files[i].Waiters == nil {
			files[i].Waiters = []store.HolderInfo{}
		}
	}
	busy := func(f store.FileLocks) bool {
		return len(f.Holders) > 0 || f.Waiting > 0 || f.Inflight > 0 || f.Appending > 0
	}
	slices.SortFunc(files, func(a, b store.FileLocks) int {
		if ba, bb := busy(a), busy(b); ba != bb {
			if ba {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Path, b.Path)
	})
	rep := locksReport{Time: now, OpenFiles: len(files), Files: files}
	if len(files) >= debugLocksScan {
		rep.Truncated = true
		rep.Note = fmt.Sprintf("more than %d files are open; only %d of them, taken in no particular order, were looked at", debugLocksScan-1, debugLocksScan)
	}
	if len(files) > limit {
		rep.Files = files[:limit]
		rep.Truncated = true
		rep.Note = strings.TrimPrefix(rep.Note+fmt.Sprintf("; %d files listed (limit %d), busy ones first", limit, limit), "; ")
	}
	if rep.Files == nil {
		rep.Files = []store.FileLocks{}
	}
	rep.Shown = len(rep.Files)
	return rep
}

// prefersHTML reports whether an Accept header ranks text/html above
// application/json: true for a browser, false for curl ("*/*") and for
// clients that ask for JSON.
func prefersHTML(accept string) bool {
	return acceptQuality(accept, "text/html") > acceptQuality(accept, "application/json")
}

// acceptQuality is the q-value an Accept header gives a media type: that
// of its most specific matching range (RFC 9110, section 12.5.1).
func acceptQuality(accept, mediaType string) float64 {
	major, _, _ := strings.Cut(mediaType, "/")
	best, q := -1, 0.0
	for part := range strings.SplitSeq(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		spec := -1
		switch mt {
		case mediaType:
			spec = 2
		case major + "/*":
			spec = 1
		case "*/*":
			spec = 0
		}
		if spec <= best {
			continue
		}
		best, q = spec, 1
		if v, ok := params["q"]; ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				q = f
			}
		}
	}
	return q
}

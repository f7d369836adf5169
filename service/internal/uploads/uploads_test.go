package uploads

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	tusd "github.com/tus/tusd/v2/pkg/handler"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// fakeCalls runs every operation, recording it, and refuses those whose
// path deny names.
type fakeCalls struct {
	mu    sync.Mutex
	calls []string
	deny  string
}

func (f *fakeCalls) Run(ctx context.Context, method string, req any, do func(context.Context) error) error {
	p := req.(interface{ GetPath() string }).GetPath()
	f.mu.Lock()
	f.calls = append(f.calls, method[strings.LastIndexByte(method, '/')+1:]+" "+p)
	deny := f.deny
	f.mu.Unlock()
	if deny != "" && p == deny {
		return status.Refusal(filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE, nil, "not yours: %s", p)
	}
	return do(ctx)
}

type tusEnv struct {
	t     *testing.T
	dir   string
	store *store.Store
	calls *fakeCalls
	door  *Door
	srv   *httptest.Server
	// owner is what Config.Owner answers: the credential of every request.
	owner string
}

func newTusEnv(t *testing.T, cfg Config) *tusEnv {
	e := &tusEnv{t: t, dir: testutil.Dir(t), calls: &fakeCalls{}}
	e.open(cfg)
	return e
}

// open opens the store and the door over e.dir: again after close, as a
// restarted daemon does.
func (e *tusEnv) open(cfg Config) {
	fsys, err := store.OpenOSFS(e.dir)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.store, err = store.Open(fsys, store.Options{MaxFileSize: 1 << 30}); err != nil {
		e.t.Fatal(err)
	}
	cfg.Store, cfg.Calls = e.store, e.calls
	cfg.MaxFileSize = 1 << 30
	cfg.Owner = func(context.Context) string { return e.owner }
	if cfg.Home == nil {
		cfg.Home = func(context.Context) (string, error) { return "home", nil }
	}
	if e.door, err = New(cfg); err != nil {
		e.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Prefix, e.door)
	e.srv = httptest.NewServer(mux)
	e.t.Cleanup(e.close)
}

func (e *tusEnv) close() {
	if e.srv == nil {
		return
	}
	e.srv.Close()
	if err := e.store.Close(); err != nil {
		e.t.Error(err)
	}
	e.srv = nil
}

func (e *tusEnv) do(method, url string, body []byte, hdr map[string]string) *http.Response {
	e.t.Helper()
	if !strings.HasPrefix(url, "http") {
		url = e.srv.URL + url
	}
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Tus-Resumable", "1.0.0")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func meta(kv ...string) string {
	var parts []string
	for i := 0; i < len(kv); i += 2 {
		parts = append(parts, kv[i]+" "+base64.StdEncoding.EncodeToString([]byte(kv[i+1])))
	}
	return strings.Join(parts, ",")
}

// create makes an upload of length n (-1: deferred) and returns its URL.
func (e *tusEnv) create(n int64, metadata string) string {
	e.t.Helper()
	hdr := map[string]string{"Upload-Metadata": metadata}
	if n < 0 {
		hdr["Upload-Defer-Length"] = "1"
	} else {
		hdr["Upload-Length"] = strconv.FormatInt(n, 10)
	}
	resp := e.do("POST", Prefix, nil, hdr)
	if resp.StatusCode != http.StatusCreated {
		e.t.Fatalf("POST: got %s, want 201", resp.Status)
	}
	return resp.Header.Get("Location")
}

func (e *tusEnv) patch(url string, off int64, data []byte, hdr map[string]string) *http.Response {
	e.t.Helper()
	h := map[string]string{"Content-Type": "application/offset+octet-stream", "Upload-Offset": strconv.FormatInt(off, 10)}
	for k, v := range hdr {
		h[k] = v
	}
	return e.do("PATCH", url, data, h)
}

func (e *tusEnv) offset(url string) int64 {
	e.t.Helper()
	resp := e.do("HEAD", url, nil, nil)
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("HEAD %s: got %s", url, resp.Status)
	}
	n, err := strconv.ParseInt(resp.Header.Get("Upload-Offset"), 10, 64)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *tusEnv) file(p string) []byte {
	b, err := os.ReadFile(filepath.Join(e.dir, p))
	if err != nil {
		return nil
	}
	return b
}

func data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i/1000)
	}
	return b
}

// TestUploadWhole: an upload in PATCHes lands at its path only once it is
// complete, with its media type; HEAD tells the offset and the expiry
// along the way, and that it is done afterwards.
func TestUploadWhole(t *testing.T) {
	e := newTusEnv(t, Config{MaxRequestBytes: 64 << 10}) // pieces of 64 KiB
	want := data(300_000)
	url := e.create(int64(len(want)), meta("path", "dir/a.bin", "filetype", "image/png"))
	if !strings.HasPrefix(url, e.srv.URL+Prefix) {
		t.Fatalf("Location %q: want under %s", url, e.srv.URL+Prefix)
	}
	off := int64(0)
	for _, n := range []int{100_000, 150_000, 50_000} {
		resp := e.patch(url, off, want[off:off+int64(n)], nil)
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("PATCH at %d: got %s", off, resp.Status)
		}
		off += int64(n)
		if got := resp.Header.Get("Upload-Offset"); got != strconv.FormatInt(off, 10) {
			t.Errorf("PATCH: Upload-Offset %s, want %d", got, off)
		}
		if off < int64(len(want)) {
			if resp.Header.Get("Upload-Expires") == "" {
				t.Errorf("PATCH of an incomplete upload: no Upload-Expires")
			}
			if got := e.file("dir/a.bin"); got != nil {
				t.Errorf("after %d bytes the file exists already (%d bytes)", off, len(got))
			}
			if got := e.offset(url); got != off {
				t.Errorf("HEAD: got offset %d, want %d", got, off)
			}
		}
	}
	if got := e.file("dir/a.bin"); !bytes.Equal(got, want) {
		t.Errorf("published file: %d bytes, equal %v; want %d", len(got), bytes.Equal(got, want), len(want))
	}
	st, err := e.store.Stat(context.Background(), "dir/a.bin")
	if err != nil || st.ContentType != "image/png" {
		t.Errorf("Stat: content type %q, %v; want image/png", st.ContentType, err)
	}
	if got := e.offset(url); got != int64(len(want)) {
		t.Errorf("HEAD after completion: offset %d, want %d", got, len(want))
	}
	if staged, _ := e.store.Staged(); len(staged) != 0 {
		t.Errorf("staged files left: %v", staged)
	}
	// What each request was checked as.
	e.calls.mu.Lock()
	calls := strings.Join(e.calls.calls, "; ")
	e.calls.mu.Unlock()
	for _, want := range []string{"Write dir/a.bin", "Stat dir/a.bin", "Rename dir/a.bin"} {
		if !strings.Contains(calls, want) {
			t.Errorf("calls %q: no %q", calls, want)
		}
	}

	resp := e.do("OPTIONS", Prefix, nil, nil)
	ext := resp.Header.Get("Tus-Extension")
	for _, x := range []string{"creation", "creation-with-upload", "creation-defer-length", "termination", "concatenation", "checksum", "expiration"} {
		if !strings.Contains(ext, x) {
			t.Errorf("OPTIONS: Tus-Extension %q lacks %s", ext, x)
		}
	}
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("OPTIONS answered CORS: tusd's CORS must be off")
	}
}

func TestUploadRefusals(t *testing.T) {
	e := newTusEnv(t, Config{})
	e.calls.deny = "secret/x"
	for _, tc := range []struct {
		name     string
		hdr      map[string]string
		wantCode int
	}{
		{"no name", map[string]string{"Upload-Length": "3"}, 400},
		{"filename with a slash", map[string]string{"Upload-Length": "3", "Upload-Metadata": meta("filename", "a/b")}, 400},
		{"unclean path", map[string]string{"Upload-Length": "3", "Upload-Metadata": meta("path", "a/../b")}, 400},
		{"state dir", map[string]string{"Upload-Length": "3", "Upload-Metadata": meta("path", ".filewrite/x")}, 400},
		{"bad filetype", map[string]string{"Upload-Length": "3", "Upload-Metadata": meta("path", "a", "filetype", "not a type")}, 400},
		{"over the size limit", map[string]string{"Upload-Length": strconv.Itoa(1<<30 + 1), "Upload-Metadata": meta("path", "a")}, 413},
		{"out of scope", map[string]string{"Upload-Length": "3", "Upload-Metadata": meta("path", "secret/x")}, 403},
		{"no Tus-Resumable", map[string]string{"Tus-Resumable": "", "Upload-Length": "3", "Upload-Metadata": meta("path", "a")}, 412},
	} {
		resp := e.do("POST", Prefix, nil, tc.hdr)
		if resp.StatusCode != tc.wantCode {
			t.Errorf("%s: got %s, want %d", tc.name, resp.Status, tc.wantCode)
		}
	}
	if recs, _ := e.store.Records(); len(recs) != 0 {
		t.Errorf("refused creations left records: %v", recs)
	}
	// filename goes to the credential's home.
	url := e.create(3, meta("filename", "f.txt"))
	e.patch(url, 0, []byte("abc"), nil)
	if got := e.file("home/f.txt"); string(got) != "abc" {
		t.Errorf("home/f.txt: got %q", got)
	}
	// Another credential does not see the upload.
	url = e.create(3, meta("path", "mine"))
	e.owner = "someone else"
	if resp := e.do("HEAD", url, nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("HEAD by another credential: got %s, want 404", resp.Status)
	}
	if resp := e.patch(url, 0, []byte("abc"), nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("PATCH by another credential: got %s, want 404", resp.Status)
	}
	e.owner = ""
	if resp := e.patch(url, 1, []byte("abc"), nil); resp.StatusCode != http.StatusConflict {
		t.Errorf("PATCH at the wrong offset: got %s, want 409", resp.Status)
	}
	if resp := e.do("GET", url, nil, nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET of an upload: got %s, want 405 (downloads are the REST route's)", resp.Status)
	}
	if resp := e.do("HEAD", Prefix+"0123456789abcdef0123456789abcdef", nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("HEAD of an unknown upload: got %s, want 404", resp.Status)
	}
}

// TestUploadChecksum: a PATCH whose Upload-Checksum does not match is
// refused with 460 and leaves the offset where it was.
func TestUploadChecksum(t *testing.T) {
	e := newTusEnv(t, Config{})
	body := []byte("hello, checksum")
	sum := sha1.Sum(body)
	good := "sha1 " + base64.StdEncoding.EncodeToString(sum[:])
	url := e.create(int64(2*len(body)), meta("path", "c"))
	for _, tc := range []struct {
		name       string
		checksum   string
		wantCode   int
		wantOffset int64
	}{
		{"wrong", "sha1 " + base64.StdEncoding.EncodeToString(make([]byte, 20)), 460, 0},
		{"unknown algorithm", "crc99 AAAA", 400, 0},
		{"malformed", "sha1", 400, 0},
		{"wrong length", "sha1 AAAA", 400, 0},
		{"right", good, 204, int64(len(body))},
	} {
		resp := e.patch(url, 0, body, map[string]string{"Upload-Checksum": tc.checksum})
		if resp.StatusCode != tc.wantCode {
			t.Errorf("%s: got %s, want %d", tc.name, resp.Status, tc.wantCode)
		}
		if got := e.offset(url); got != tc.wantOffset {
			t.Errorf("%s: offset %d, want %d", tc.name, got, tc.wantOffset)
		}
	}
	resp := e.do("OPTIONS", Prefix, nil, nil)
	if got := resp.Header.Get("Tus-Checksum-Algorithm"); !strings.Contains(got, "sha1") {
		t.Errorf("Tus-Checksum-Algorithm %q: want sha1 among them", got)
	}
}

func TestUploadDeferTerminateConcat(t *testing.T) {
	e := newTusEnv(t, Config{})
	// Deferred length, declared with the last PATCH.
	url := e.create(-1, meta("path", "deferred"))
	e.patch(url, 0, []byte("abc"), nil)
	if resp := e.patch(url, 3, []byte("def"), map[string]string{"Upload-Length": "6"}); resp.StatusCode != http.StatusNoContent {
		t.Errorf("last PATCH with Upload-Length: got %s", resp.Status)
	}
	if got := e.file("deferred"); string(got) != "abcdef" {
		t.Errorf("deferred: got %q", got)
	}

	// Termination removes what was staged.
	url = e.create(10, meta("path", "gone"))
	e.patch(url, 0, []byte("abc"), nil)
	if resp := e.do("DELETE", url, nil, nil); resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE: got %s", resp.Status)
	}
	if resp := e.do("HEAD", url, nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("HEAD after DELETE: got %s, want 404", resp.Status)
	}
	if staged, _ := e.store.Staged(); len(staged) != 0 {
		t.Errorf("staged after DELETE: %v", staged)
	}

	// Concatenation of two partial uploads.
	var parts []string
	for _, s := range []string{"first half, ", "second half"} {
		resp := e.do("POST", Prefix, nil, map[string]string{"Upload-Length": strconv.Itoa(len(s)), "Upload-Concat": "partial"})
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST partial: %s", resp.Status)
		}
		u := resp.Header.Get("Location")
		e.patch(u, 0, []byte(s), nil)
		parts = append(parts, u)
	}
	resp := e.do("POST", Prefix, nil, map[string]string{"Upload-Concat": "final;" + strings.Join(parts, " "), "Upload-Metadata": meta("path", "joined")})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST final: %s", resp.Status)
	}
	if got := e.file("joined"); string(got) != "first half, second half" {
		t.Errorf("joined: got %q", got)
	}
	if staged, _ := e.store.Staged(); len(staged) != 0 {
		t.Errorf("staged after concatenation: %v", staged)
	}
}

// TestUploadRestart: a door over a reopened store resumes at the offset
// acknowledged before, and publishes a complete upload whose publish the
// daemon did not finish.
func TestUploadRestart(t *testing.T) {
	e := newTusEnv(t, Config{})
	want := data(10_000)
	url := e.create(int64(len(want)), meta("path", "r"))
	e.patch(url, 0, want[:4000], nil)
	path := strings.TrimPrefix(url, e.srv.URL)
	e.close()
	e.open(Config{})
	if got := e.offset(path); got != 4000 {
		t.Fatalf("offset after restart: %d, want 4000", got)
	}
	if resp := e.patch(path, 4000, want[4000:], nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PATCH after restart: %s", resp.Status)
	}
	if got := e.file("r"); !bytes.Equal(got, want) {
		t.Errorf("after restart: %d bytes, want %d", len(got), len(want))
	}

	// A record marked done with its staged file still there: the daemon
	// stopped in the middle of the publish.
	url = e.create(3, meta("path", "half-published"))
	id := url[strings.LastIndexByte(url, '/')+1:]
	h, err := e.store.OpenStaged(context.Background(), stagedName(id), store.OpenMustExist)
	if err != nil {
		t.Fatal(err)
	}
	h.Write(context.Background(), 0, []byte("xyz"), store.SyncData)
	h.Close()
	rec, err := e.door.getRecord(id)
	if err != nil {
		t.Fatal(err)
	}
	rec.Done = true
	if err := e.door.putRecord(rec); err != nil {
		t.Fatal(err)
	}
	e.close()
	e.open(Config{})
	e.door.Sweep(context.Background())
	if got := e.file("half-published"); string(got) != "xyz" {
		t.Errorf("after the sweep: got %q, want the publish finished", got)
	}
}

// TestUploadExpiry: the sweep removes an upload idle past the expiry, and
// the record of a complete one, and leaves the rest.
func TestUploadExpiry(t *testing.T) {
	e := newTusEnv(t, Config{Expiry: time.Second})
	idle := e.create(10, meta("path", "idle"))
	e.patch(idle, 0, []byte("abc"), nil)
	done := e.create(3, meta("path", "done"))
	e.patch(done, 0, []byte("abc"), nil)
	time.Sleep(1100 * time.Millisecond)
	fresh := e.create(10, meta("path", "fresh"))
	e.door.Sweep(context.Background())
	for _, tc := range []struct {
		url  string
		want int
	}{{idle, 404}, {done, 404}, {fresh, 200}} {
		if resp := e.do("HEAD", tc.url, nil, nil); resp.StatusCode != tc.want {
			t.Errorf("HEAD %s after the sweep: got %s, want %d", tc.url, resp.Status, tc.want)
		}
	}
	if got := e.file("done"); string(got) != "abc" {
		t.Errorf("a complete upload's file: got %q, want it kept", got)
	}
	staged, _ := e.store.Staged()
	if len(staged) != 1 {
		t.Errorf("staged after the sweep: %v, want the fresh upload's alone", staged)
	}
}

func TestHTTPError(t *testing.T) {
	for _, tc := range []struct {
		err      error
		wantCode int
		wantBody string
	}{
		{status.Refusal(filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE, nil, "no"), 403, "PERMISSION_DENIED_SCOPE"},
		{grpcstatus.Error(codes.Unavailable, "down"), 503, "down"},
		{fmt.Errorf("wrapped: %w", store.ErrNoSpace), 429, "NO_SPACE"},
	} {
		he := httpError(tc.err).(tusd.Error)
		code, body := he.HTTPResponse.StatusCode, he.HTTPResponse.Body
		if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("%v: got %d %s, want %d with %q", tc.err, code, body, tc.wantCode, tc.wantBody)
		}
	}
}

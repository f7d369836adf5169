package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
)

// faultSoakEnv sets how long TestFaultSoak runs (a Go duration); about
// 20 s without it.
const faultSoakEnv = "FILEWRITE_FAULT_SOAK"

// reasonChangedOutside is the reason of a call that found its file cut
// short from outside the daemon.
var reasonChangedOutside = filewritev1.ErrorReason_FILE_CHANGED_OUTSIDE.String()

// The soak's shape.
const (
	soakSlotFiles    = 16
	soakSlotsPerFile = 64
	// soakHotFiles of the slot files are never synced, so that their
	// writes go through the daemon's file mappings once the files are
	// hot; the cutter cuts them more often than the others.
	soakHotFiles = 4
	// The cut probe's files: slots of soakProbeSlot bytes, soakProbeSlots
	// of them a file (cutProbe).
	soakProbeSlot   = 100
	soakProbeSlots  = 160
	soakAppendFiles = 4
	soakRecord      = 512 // bytes of an append
	// soakDisk is the loop-mounted filesystem: a few MiB of slot files
	// and appends, and room for the filler to fill.
	soakDisk = 160 << 20
	// soakInflight is --max-inflight-bytes: the daemon's anonymous
	// memory must stay within it plus memorySoakOverhead.
	soakInflight = 64 << 20
	// soakOpenFiles is --max-open-files, which bounds the files the
	// daemon holds, and with them its file mappings.
	soakOpenFiles = 1024
	// soakGrown is how many files the grower grows, over and over: more
	// than soakOpenFiles, so that the daemon closes some to make room.
	soakGrown = 1500
	// soakMapsPerFile and soakMapsBase bound the daemon's memory
	// mappings (/proc/pid/maps): a file holds its mapping and at most
	// one it retired; the rest is the runtime's, the binary's and the
	// libraries'.
	soakMapsPerFile = 2
	soakMapsBase    = 1000
)

// TestFaultSoak writes under a model while the daemon is SIGKILLed and
// restarted, its files are cut short from outside, its disk fills and
// empties, and files are grown as the mapping attack of issue 36 grew
// them. Many clients write at once: unary Writes, the Go client's
// streams, raw REST PUTs, gRPC and REST appends, each owning its slots of
// the slot files (soakModel). After each kill, with the daemon down, every
// byte of every slot must hold what the model allows: every write
// acknowledged, synced or not (a SIGKILL loses no page cache), unless its
// file was cut from outside since; and a cut of a file the daemon held
// must be reported (FILE_CHANGED_OUTSIDE) by a call that follows it
// (cutProbe). Throughout, the daemon must die only by the soak's hand,
// and its anonymous memory and its count of memory mappings stay bounded.
//
// About 20 s; FILEWRITE_FAULT_SOAK=10m soaks longer. The disk fills only
// on a loop-mounted ext4, which needs root; without it the soak runs on
// the test's directory and says so. It logs what it did.
func TestFaultSoak(t *testing.T) {
	length := soakLength(t, faultSoakEnv, 20*time.Second)
	dir := testutil.Dir(t)
	disk, why := mountSmallExt4(t, dir, soakDisk)
	if disk == "" {
		t.Logf("the disk will not fill: %s", why)
		disk = filepath.Join(dir, "disk")
	}
	root := filepath.Join(disk, "root")
	// Without -race whatever the test runs with: the memory bound is the
	// daemon's, and the race detector multiplies memory.
	bin := testutil.BuildDaemon(t, dir, false)
	sockDir, err := os.MkdirTemp("", "soak-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "grpc.sock")
	httpAddr := testutil.FreeAddr(t) // the same across restarts
	ctx, cancel := context.WithTimeout(t.Context(), length+5*time.Minute)
	defer cancel()

	d := &soakDaemon{t: t, bin: bin, args: []string{
		"--root", root, "--grpc-addr", "unix:" + sock, "--http-addr", httpAddr,
		"--max-request-bytes", "4m", "--max-inflight-bytes", strconv.Itoa(soakInflight), "--max-open-files", strconv.Itoa(soakOpenFiles),
		"--drain-timeout", "10s",
	}}
	d.start(ctx)

	var slotFiles, appendFiles []string
	for i := range soakSlotFiles {
		slotFiles = append(slotFiles, fmt.Sprintf("slots/f%02d", i))
	}
	for i := range soakAppendFiles {
		appendFiles = append(appendFiles, fmt.Sprintf("appends/log%d", i))
	}
	// Slots of a page and smaller ones, so that writes share blocks and
	// pages, land both aligned and not, and some fit whole in the tail of
	// the page where a cut from outside leaves the file's end.
	model := newSoakModel()
	slots := model.addFiles(slotFiles, soakSlotsPerFile, func(i int) int { return []int{4096, 512, 3001, 1000}[i%4] })
	probed := model.addFiles([]string{"cut/probe0", "cut/probe1"}, soakProbeSlots, func(int) int { return soakProbeSlot })
	conn := testutil.PlaintextConn(t, "unix:"+sock)
	streams, err := client.Dial("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer streams.Close()
	hot := map[string]bool{}
	for _, f := range slotFiles[:soakHotFiles] {
		hot[f] = true
	}
	e := &soakEnv{
		ctx:      ctx,
		stop:     make(chan struct{}),
		model:    model,
		files:    filewritev1.NewFileServiceClient(conn),
		streams:  streams,
		http:     &http.Client{Transport: &http.Transport{}},
		base:     "http://" + httpAddr,
		root:     root,
		disk:     disk,
		canFill:  why == "",
		appendTo: appendFiles,
		hot:      hot,
		life:     d.lives,
		tally:    newTally(),
	}
	defer e.http.CloseIdleConnections()

	var actors sync.WaitGroup
	writers := []func(int, []*soakSlot){e.unaryWriter, e.unaryWriter, e.unaryWriter, e.streamWriter, e.streamWriter, e.restWriter, e.restWriter}
	for w, write := range writers {
		var own []*soakSlot
		for i, s := range slots {
			if i%len(writers) == w {
				own = append(own, s)
			}
		}
		actors.Go(func() { write(w, own) })
	}
	for a := range 2 {
		actors.Go(func() { e.appender(a) })
	}
	actors.Go(e.grower)
	actors.Go(func() { e.cutter(slotFiles, slotFiles[:soakHotFiles]) })
	actors.Go(func() { e.cutProbe(probed) })
	if e.canFill {
		actors.Go(e.filler)
	}
	peaks := &soakPeaks{}
	actors.Go(func() { e.watch(d, peaks) })

	// The killer: the soak's own loop. Each kill is followed, with the
	// daemon down, by a check of every file against the model.
	end := time.Now().Add(length)
	every := min(max(4*time.Second, length/8), 20*time.Second)
	var checked soakCheck
	for time.Now().Add(every).Before(end) && !t.Failed() {
		select {
		case <-time.After(every):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		d.kill()
		c := model.check(e.readFile)
		checked.add(c)
		e.tally.add("kills and checks")
		d.start(ctx)
	}
	if wait := time.Until(end); wait > 0 {
		time.Sleep(wait)
	}
	close(e.stop)
	actors.Wait()
	os.Remove(filepath.Join(disk, "ballast"))
	// A cut not yet reported would be by the final close, failing the
	// shutdown: have each reported now, as the next call on it would.
	for f := range model.files {
		_, err := e.files.Stat(ctx, &filewritev1.StatRequest{Path: f})
		e.tally.outcome("Stat before the shutdown", err)
	}
	// The last check follows a drain, not a kill.
	if err := d.stop(); err != nil {
		t.Errorf("the daemon's shutdown after the soak: %v\n%s", err, d.tail())
	}
	checked.add(model.check(e.readFile))

	filled := fmt.Sprintf("disk filled %d times", e.tally.get("disk filled"))
	if !e.canFill {
		filled = "disk never filled: " + why
	}
	t.Logf("fault soak, %v: %d restarts after SIGKILL; %s", length, d.lives()-1, filled)
	t.Logf("operations: %s", e.tally)
	t.Logf("checked %d times: %d bytes acknowledged on disk where the model puts them, %d of them synced",
		e.tally.get("kills and checks")+1, checked.bytes, checked.synced)
	t.Logf("daemon peaks: anonymous memory %d MiB, resident %d MiB, %d memory mappings (%d of files under the root)",
		peaks.anon.Load()>>20, peaks.rss.Load()>>20, peaks.maps.Load(), peaks.fileMaps.Load())
	for _, p := range checked.problems {
		t.Error(p)
	}
	if checked.bad > len(checked.problems) {
		t.Errorf("%d slots and appends in all did not hold what they may", checked.bad)
	}
	if n := e.tally.get("cut probe rounds not reported"); n > 0 {
		t.Errorf("%d times the daemon held a file across a cut from outside and no call after it said %s", n, reasonChangedOutside)
	}
	if checked.bytes == 0 {
		t.Error("nothing acknowledged was checked: the writers never got through")
	}
	if bound := int64(soakInflight + memorySoakOverhead); peaks.anon.Load() > bound {
		t.Errorf("the daemon's anonymous memory reached %d MiB, over --max-inflight-bytes plus %d MiB", peaks.anon.Load()>>20, memorySoakOverhead>>20)
	}
	if bound := int64(soakMapsPerFile*soakOpenFiles + soakMapsBase); peaks.maps.Load() > bound {
		t.Errorf("the daemon held %d memory mappings, over %d (%d per open file and %d)", peaks.maps.Load(), bound, soakMapsPerFile, soakMapsBase)
	}
}

// soakDaemon is the daemon of the soak, one process at a time. An exit
// that the soak did not cause (kill, stop) fails the test: no client
// action may end the daemon.
type soakDaemon struct {
	t    *testing.T
	bin  string
	args []string

	mu       sync.Mutex
	proc     *daemonproc.Process    // guarded by mu
	logs     *testutil.LockedBuffer // guarded by mu
	expected bool                   // the soak ends proc; guarded by mu
	starts   int                    // guarded by mu
}

func (d *soakDaemon) start(ctx context.Context) {
	d.t.Helper()
	proc, logs := testutil.StartDaemon(d.t, ctx, d.bin, d.args...)
	d.mu.Lock()
	d.proc, d.logs, d.expected = proc, logs, false
	d.starts++
	d.mu.Unlock()
	go func() {
		<-proc.Exited()
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.expected && d.proc == proc {
			d.t.Errorf("the daemon exited by itself (%v):\n%s", proc.Wait(), tail(logs.String(), 40))
		}
	}()
}

// current is the running process.
func (d *soakDaemon) current() *daemonproc.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc
}

// kill ends the daemon with SIGKILL, as a crash would, and waits for it.
func (d *soakDaemon) kill() {
	d.mu.Lock()
	d.expected = true
	p := d.proc
	d.mu.Unlock()
	p.Kill()
	p.Wait()
}

// stop drains the daemon (SIGTERM) and returns its exit.
func (d *soakDaemon) stop() error {
	d.mu.Lock()
	d.expected = true
	p := d.proc
	d.mu.Unlock()
	return p.Stop(time.Minute)
}

// lives counts the processes started.
func (d *soakDaemon) lives() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts
}

func (d *soakDaemon) tail() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return tail(d.logs.String(), 40)
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// soakEnv is what the soak's actors share.
type soakEnv struct {
	ctx      context.Context
	stop     chan struct{}
	model    *soakModel
	files    filewritev1.FileServiceClient
	streams  *client.Client
	http     *http.Client
	base     string
	root     string // the daemon's --root
	disk     string // the filesystem it is on
	canFill  bool
	appendTo []string
	// hot are the slot files never synced (soakHotFiles).
	hot map[string]bool
	// life counts the daemon's starts: a cut and a call in one life
	// reached the same process.
	life  func() int
	tally *tally
}

func (e *soakEnv) stopped() bool {
	select {
	case <-e.stop:
		return true
	default:
		return false
	}
}

// failed notes a call's failure and waits a moment: while the daemon is
// down, every call fails at once.
func (e *soakEnv) failed() {
	select {
	case <-e.stop:
	case <-time.After(20 * time.Millisecond):
	}
}

// readFile is a file under the root as it is on disk; nil if missing.
func (e *soakEnv) readFile(name string) []byte {
	b, _ := os.ReadFile(filepath.Join(e.root, name))
	return b
}

// syncModes are the modes writers pick from.
var syncModes = []filewritev1.SyncMode{filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED, filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED, filewritev1.SyncMode_SYNC_MODE_DATA, filewritev1.SyncMode_SYNC_MODE_FULL}

// unaryWriter rewrites its slots with unary Writes, and now and then
// syncs a file with Fsync.
func (e *soakEnv) unaryWriter(w int, slots []*soakSlot) {
	rng := rand.New(rand.NewPCG(uint64(w), 1))
	for !e.stopped() {
		s := slots[rng.IntN(len(slots))]
		v, data := e.model.send(s)
		mode := syncModes[rng.IntN(len(syncModes))]
		if e.hot[s.file] {
			mode = filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
		}
		_, err := e.files.Write(e.ctx, &filewritev1.WriteRequest{Path: s.file, Offset: s.off, Data: data, Sync: mode})
		e.tally.outcome("unary Write", err)
		if err != nil {
			e.failed()
			continue
		}
		e.model.acked(s, v, mode != filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
		if rng.IntN(16) == 0 && !e.hot[s.file] {
			_, err := e.files.Fsync(e.ctx, &filewritev1.FsyncRequest{Path: s.file, DataOnly: true})
			e.tally.outcome("Fsync", err)
			if err == nil {
				for _, o := range slots {
					if o.file == s.file {
						e.model.syncedUpTo(o)
					}
				}
			}
		}
	}
}

// streamWriter rewrites its slots through the Go client, whose Files
// carry their writes over WriteStreams.
func (e *soakEnv) streamWriter(w int, slots []*soakSlot) {
	rng := rand.New(rand.NewPCG(uint64(w), 2))
	open := map[string]*client.File{}
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	modes := []client.SyncMode{client.SyncNone, client.SyncNone, client.SyncData}
	for !e.stopped() {
		s := slots[rng.IntN(len(slots))]
		f := open[s.file]
		if f == nil {
			var err error
			if f, err = e.streams.Open(e.ctx, s.file); err != nil {
				e.tally.outcome("stream Open", err)
				e.failed()
				continue
			}
			open[s.file] = f
		}
		v, data := e.model.send(s)
		mode := modes[rng.IntN(len(modes))]
		if e.hot[s.file] {
			mode = client.SyncNone
		}
		_, _, err := f.Write(e.ctx, data, s.off, mode)
		e.tally.outcome("stream write", err)
		if err != nil {
			// A File whose stream broke opens another; one that was
			// closed for good is opened again.
			if errors.Is(err, os.ErrClosed) {
				delete(open, s.file)
			}
			e.failed()
			continue
		}
		e.model.acked(s, v, mode != client.SyncNone)
	}
}

// restWriter rewrites its slots with raw PUTs.
func (e *soakEnv) restWriter(w int, slots []*soakSlot) {
	rng := rand.New(rand.NewPCG(uint64(w), 3))
	for !e.stopped() {
		s := slots[rng.IntN(len(slots))]
		v, data := e.model.send(s)
		sync := []string{"none", "none", "data"}[rng.IntN(3)]
		if e.hot[s.file] {
			sync = "none"
		}
		status, _, body, err := e.rest(http.MethodPut, fmt.Sprintf("/v1/files/%s?offset=%d&sync=%s", s.file, s.off, sync), data)
		ok := err == nil && (status == http.StatusOK || status == http.StatusCreated)
		e.tally.outcomeHTTP("REST PUT", status, body)
		if !ok {
			e.failed()
			continue
		}
		e.model.acked(s, v, sync != "none")
	}
}

// rest sends a raw-bytes request and returns its status, headers and
// body.
func (e *soakEnv) rest(method, path string, body []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(e.ctx, method, e.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", mimeOctetStream)
	resp, err := e.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// appender appends records, over gRPC and REST in turn, each with an
// append id, so that a resend after a restart lands once.
func (e *soakEnv) appender(a int) {
	rng := rand.New(rand.NewPCG(uint64(a), 4))
	for seq := 0; !e.stopped(); seq++ {
		file := e.appendTo[rng.IntN(len(e.appendTo))]
		record := bytes.Repeat(fmt.Appendf(nil, "[appender %d record %d]", a, seq), soakRecord)[:soakRecord]
		id := fmt.Sprintf("a%d-%d", a, seq)
		synced := rng.IntN(2) == 0
		var off int64
		var err error
		if seq%2 == 0 {
			sync := filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED
			if synced {
				sync = filewritev1.SyncMode_SYNC_MODE_DATA
			}
			var resp *filewritev1.AppendResponse
			resp, err = e.files.Append(e.ctx, &filewritev1.AppendRequest{Path: file, Data: record, Sync: sync, AppendId: id})
			off = resp.GetOffset()
			e.tally.outcome("gRPC Append", err)
		} else {
			q := "none"
			if synced {
				q = "data"
			}
			var code int
			var h http.Header
			var body []byte
			code, h, body, err = e.rest(http.MethodPost, fmt.Sprintf("/v1/files/%s:append?sync=%s&append_id=%s", file, q, id), record)
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("HTTP %d", code)
			}
			if err == nil {
				off, err = strconv.ParseInt(h.Get("Filewrite-Offset"), 10, 64)
			}
			e.tally.outcomeHTTP("REST append", code, body)
		}
		if err != nil {
			e.failed()
			continue
		}
		e.model.appended(soakAppend{file: file, off: off, record: record, synced: synced})
	}
}

// grower makes files grow as the mapping attack of issue 36 did: a byte
// written 9 times at 0, then at each power of two up to 64 MiB a write
// and an overwrite. Its files are not checked: they are there to put the
// daemon's mappings under pressure. It deletes and grows again the same
// soakGrown files, so that a long soak does not run out of inodes.
func (e *soakEnv) grower() {
	for n := 0; !e.stopped(); n++ {
		path := fmt.Sprintf("grown/%d", n%soakGrown)
		if n >= soakGrown {
			_, err := e.files.Delete(e.ctx, &filewritev1.DeleteRequest{Path: path})
			e.tally.outcome("grower Delete", err)
		}
		write := func(off int64) bool {
			_, err := e.files.Write(e.ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: []byte{byte(n)}})
			e.tally.outcome("grower Write", err)
			return err == nil
		}
		ok := true
		for range 9 {
			ok = ok && write(0)
		}
		for l := int64(1); ok && l <= 64<<20 && !e.stopped(); l *= 2 {
			ok = write(l) && write(l)
		}
		if !ok {
			e.failed()
		}
	}
}

// cutter cuts slot files short from outside the daemon, to a size that
// is no multiple of a page, the hot ones three times in four, and then
// Stats each through the daemon, which must say that the file changed
// outside where it held it.
func (e *soakEnv) cutter(files, hot []string) {
	rng := rand.New(rand.NewPCG(5, 5))
	for !e.stopped() {
		select {
		case <-e.stop:
			return
		case <-time.After(time.Duration(300+rng.IntN(400)) * time.Millisecond):
		}
		file := files[rng.IntN(len(files))]
		if rng.IntN(4) > 0 {
			file = hot[rng.IntN(len(hot))]
		}
		path := filepath.Join(e.root, file)
		fi, err := os.Stat(path)
		if err != nil || fi.Size() < 2 {
			continue
		}
		size := 1 + rng.Int64N(fi.Size()-1)
		if size%4096 == 0 {
			size--
		}
		if err := e.model.cut(file, size, func() error { return os.Truncate(path, size) }); err != nil {
			continue
		}
		e.tally.add("outside truncates")
		_, err = e.files.Stat(e.ctx, &filewritev1.StatRequest{Path: file})
		if errorinfo.Reason(err) == reasonChangedOutside {
			e.tally.add("outside truncates reported by the next Stat")
		}
	}
}

// cutProbe does to its own files, round after round, what issue 36's
// second finding did: it makes a file hot with unsynced stream writes
// (so that they go through the daemon's mapping), cuts it from outside to
// a size that is no multiple of a page, and at once rewrites the slots
// that lie whole past the cut in the page that holds the new end, where
// a store through the mapping does not fault. Those writes, acknowledged,
// must be on disk at the next check; the Stat that follows them must say
// the file changed outside.
func (e *soakEnv) cutProbe(slots []*soakSlot) {
	rng := rand.New(rand.NewPCG(6, 6))
	byFile := map[string][]*soakSlot{}
	for _, s := range slots {
		byFile[s.file] = append(byFile[s.file], s)
	}
	var files []string
	for f := range byFile {
		files = append(files, f)
	}
	slices.Sort(files)
	open := map[string]*client.File{}
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	// reported: a call since the cut said FILE_CHANGED_OUTSIDE.
	var reported bool
	write := func(f *client.File, s *soakSlot) bool {
		v, data := e.model.send(s)
		_, _, err := f.Write(e.ctx, data, s.off, client.SyncNone)
		e.tally.outcome("cut probe write", err)
		if err == nil {
			e.model.acked(s, v, false)
		}
		reported = reported || errorinfo.Reason(err) == reasonChangedOutside
		return err == nil
	}
	for !e.stopped() {
		name := files[rng.IntN(len(files))]
		f := open[name]
		if f == nil {
			var err error
			if f, err = e.streams.Open(e.ctx, name); err != nil {
				e.tally.outcome("stream Open", err)
				e.failed()
				continue
			}
			open[name] = f
		}
		ok := true
		for range 4 {
			for _, s := range byFile[name] {
				ok = ok && write(f, s)
			}
		}
		if !ok {
			e.failed()
			continue
		}
		// A cut in the first three quarters of a page past the first,
		// so that whole slots fit between it and the page's end.
		end := int64(len(byFile[name]) * soakProbeSlot)
		size := 4096*(1+rng.Int64N(end/4096-1)) + 1 + rng.Int64N(3000)
		path := filepath.Join(e.root, name)
		life := e.life()
		if err := e.model.cut(name, size, func() error { return os.Truncate(path, size) }); err != nil {
			continue
		}
		reported = false
		e.tally.add("cut probe rounds")
		for _, s := range byFile[name] {
			if s.off >= size && s.off+int64(s.size) <= (size+4095)/4096*4096 {
				write(f, s)
			}
		}
		_, err := e.files.Stat(e.ctx, &filewritev1.StatRequest{Path: name})
		switch {
		case reported || errorinfo.Reason(err) == reasonChangedOutside:
			e.tally.add("cut probe rounds reported")
		case err == nil && e.life() == life:
			// The daemon held the file across the cut (the stream
			// has it open) and said nothing.
			e.tally.add("cut probe rounds not reported")
		}
	}
}

// filler fills the disk from outside the daemon, holds it full a moment,
// and empties it again, over and over.
func (e *soakEnv) filler() {
	ballast := filepath.Join(e.disk, "ballast")
	chunk := make([]byte, 1<<20)
	for !e.stopped() {
		select {
		case <-e.stop:
			return
		case <-time.After(1500 * time.Millisecond):
		}
		f, err := os.Create(ballast)
		if err != nil {
			continue
		}
		for !e.stopped() {
			if _, err := f.Write(chunk); err != nil {
				if errors.Is(err, syscall.ENOSPC) {
					e.tally.add("disk filled")
				}
				break
			}
		}
		f.Close()
		select {
		case <-e.stop:
		case <-time.After(time.Second):
		}
		os.Remove(ballast)
	}
}

// soakPeaks are the highest of the daemon's figures seen, over every
// process of the soak.
type soakPeaks struct {
	anon, rss, maps atomic.Int64
	// fileMaps is the most mappings of files under the root at once:
	// writes go through them, the cutters cut them, the grower grows them.
	fileMaps atomic.Int64
}

// watch samples the running daemon's memory and mappings until the soak
// stops.
func (e *soakEnv) watch(d *soakDaemon, peaks *soakPeaks) {
	raise := func(p *atomic.Int64, v int64) {
		for old := p.Load(); v > old && !p.CompareAndSwap(old, v); old = p.Load() {
		}
	}
	for !e.stopped() {
		pid := d.current().Pid()
		if kb, err := procStatusKB(pid, "RssAnon"); err == nil {
			raise(&peaks.anon, kb<<10)
		}
		if kb, err := procStatusKB(pid, "VmRSS"); err == nil {
			raise(&peaks.rss, kb<<10)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil {
			raise(&peaks.maps, int64(bytes.Count(b, []byte{'\n'})))
			raise(&peaks.fileMaps, int64(bytes.Count(b, []byte(e.root+"/"))))
		}
		select {
		case <-e.stop:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tally counts what the soak did, by what and how it ended.
type tally struct {
	mu sync.Mutex
	n  map[string]int64 // guarded by mu
}

func newTally() *tally { return &tally{n: map[string]int64{}} }

func (t *tally) add(what string) {
	t.mu.Lock()
	t.n[what]++
	t.mu.Unlock()
}

func (t *tally) get(what string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[what]
}

// outcome counts a gRPC call of kind: OK, or failed with its reason (its
// code where it has none).
func (t *tally) outcome(kind string, err error) {
	switch {
	case err == nil:
		t.add(kind + " ok")
	case errorinfo.Reason(err) != "":
		t.add(kind + " " + errorinfo.Reason(err))
	default:
		t.add(kind + " " + status.Code(err).String())
	}
}

// outcomeHTTP counts a REST request of kind: OK, refused with its status
// and reason, or not answered.
func (t *tally) outcomeHTTP(kind string, code int, body []byte) {
	switch {
	case code == 0:
		t.add(kind + " unanswered")
	case code < 300:
		t.add(kind + " ok")
	default:
		var st struct {
			Details []struct{ Reason string }
		}
		json.Unmarshal(body, &st)
		reason := ""
		for _, d := range st.Details {
			if d.Reason != "" {
				reason += " " + d.Reason
			}
		}
		t.add(kind + " " + strconv.Itoa(code) + reason)
	}
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.n))
	for k := range t.n {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-48s %d", k, t.n[k])
	}
	return b.String()
}

// add sums c into what the soak checked.
func (c *soakCheck) add(o soakCheck) {
	c.bytes += o.bytes
	c.synced += o.synced
	c.bad += o.bad
	c.problems = append(c.problems, o.problems...)
}

package service

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store/faultfs"
)

// filesStream is a WriteStream of declared files under test: a goroutine
// reads its responses, and the test waits for what it expects.
type filesStream struct {
	t      *testing.T
	stream writeStreamClient
	mu     sync.Mutex
	cond   *sync.Cond
	acks   map[uint64]*filewritev1.StreamAck
	files  map[uint32]*filewritev1.StreamFileStatus
	ended  bool
	endErr error
}

func openFilesStream(t *testing.T, ctx context.Context, client filewritev1.FileServiceClient) *filesStream {
	t.Helper()
	stream, err := client.WriteStream(ctx)
	if err != nil {
		t.Fatalf("WriteStream: %v", err)
	}
	fs := &filesStream{t: t, stream: stream, acks: map[uint64]*filewritev1.StreamAck{}, files: map[uint32]*filewritev1.StreamFileStatus{}}
	fs.cond = sync.NewCond(&fs.mu)
	go func() {
		for {
			resp, err := stream.Recv()
			fs.mu.Lock()
			if err != nil {
				fs.ended, fs.endErr = true, err
				fs.cond.Broadcast()
				fs.mu.Unlock()
				return
			}
			for _, f := range resp.GetFiles() {
				if _, dup := fs.files[f.GetIndex()]; dup {
					t.Errorf("file %d reported twice", f.GetIndex())
				}
				fs.files[f.GetIndex()] = f
			}
			for _, a := range resp.GetAcks() {
				if _, dup := fs.acks[a.GetId()]; dup {
					t.Errorf("write %d acked twice", a.GetId())
				}
				fs.acks[a.GetId()] = a
			}
			fs.cond.Broadcast()
			fs.mu.Unlock()
		}
	}()
	return fs
}

func (fs *filesStream) send(m *filewritev1.WriteStreamRequest) {
	fs.t.Helper()
	if err := fs.stream.Send(m); err != nil {
		fs.t.Fatalf("send: %v", err)
	}
}

// ack waits for write id's ack.
func (fs *filesStream) ack(id uint64) *filewritev1.StreamAck {
	fs.t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for fs.acks[id] == nil && !fs.ended {
		fs.cond.Wait()
	}
	if fs.acks[id] == nil {
		fs.t.Fatalf("the stream ended with %v before write %d was acked", fs.endErr, id)
	}
	return fs.acks[id]
}

// file waits for file index's report.
func (fs *filesStream) file(index uint32) *filewritev1.StreamFileStatus {
	fs.t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for fs.files[index] == nil && !fs.ended {
		fs.cond.Wait()
	}
	if fs.files[index] == nil {
		fs.t.Fatalf("the stream ended with %v before file %d was reported", fs.endErr, index)
	}
	return fs.files[index]
}

// end half-closes the stream and waits for its end, which must be OK.
func (fs *filesStream) end() {
	fs.t.Helper()
	if err := fs.stream.CloseSend(); err != nil {
		fs.t.Fatal(err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for !fs.ended {
		fs.cond.Wait()
	}
	if status.Code(fs.endErr) != codes.OK && fs.endErr.Error() != "EOF" {
		fs.t.Fatalf("the stream ended with %v, want OK", fs.endErr)
	}
}

func declare(index uint32, path string) *filewritev1.StreamFile {
	return &filewritev1.StreamFile{Index: index, Path: path}
}

func fileWrite(file uint32, id uint64, off int64, data []byte, sync filewritev1.SyncMode) *filewritev1.StreamWrite {
	w := streamWriteOf(id, off, data, sync)
	w.File = file
	return w
}

func fileReason(s *filewritev1.StreamFileStatus) string {
	return errorinfo.From(status.ErrorProto(s.GetStatus())).GetReason()
}

func ackReason(a *filewritev1.StreamAck) string {
	if a.GetStatus() == nil {
		return ""
	}
	return errorinfo.From(status.ErrorProto(a.GetStatus())).GetReason()
}

// TestStreamFilesInterleaved: writes to many declared files, and to the
// file of the stream's path, interleaved on one stream, overlapping within
// each file: every file ends as if its writes were applied one by one in
// the order sent, and every write is acked once, OK.
func TestStreamFilesInterleaved(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	fs := openFilesStream(t, ctx, d.client)
	const files, messages, perMessage = 24, 40, 16
	first := &filewritev1.WriteStreamRequest{Path: "many/main"}
	for i := range uint32(files) {
		first.Files = append(first.Files, declare(i+1, fmt.Sprintf("many/%d", i+1)))
	}
	fs.send(first)
	want := make([][]byte, files+1)
	rng := rand.New(rand.NewPCG(1, 2))
	id := uint64(0)
	for range messages {
		m := &filewritev1.WriteStreamRequest{}
		for range perMessage {
			f := uint32(rng.IntN(files + 1))
			off := int64(rng.IntN(64))
			data := bytes.Repeat([]byte{byte(id)}, 1+rng.IntN(32))
			want[f] = overlay(want[f], off, data)
			m.Writes = append(m.Writes, fileWrite(f, id, off, data, filewritev1.SyncMode(id%3)))
			id++
		}
		fs.send(m)
	}
	fs.end()
	for w := range id {
		if a := fs.acks[w]; a == nil || a.GetStatus() != nil {
			t.Errorf("write %d: ack %v, want OK", w, a)
		}
	}
	for i := range uint32(files) {
		if s := fs.files[i+1]; s == nil || s.GetStatus() != nil {
			t.Errorf("file %d: reported %v, want open", i+1, s)
		}
	}
	for f := range want {
		name := "many/main"
		if f > 0 {
			name = fmt.Sprintf("many/%d", f)
		}
		if got := d.onDisk(t, name); !bytes.Equal(got, want[f]) {
			t.Errorf("%s: %q, want %q", name, got, want[f])
		}
	}
}

// TestStreamFilesDeletedRenamedClosed: a declared file deleted mid-stream
// fails only its own writes; one renamed is written on under its new name;
// one closed by a message frees its index and its open file, and the
// stream goes on, with more files over its life than --max-open-files.
func TestStreamFilesDeletedRenamedClosed(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxOpenFiles = 3 })
	ctx := testContext(t)
	fs := openFilesStream(t, ctx, d.client)
	fs.send(&filewritev1.WriteStreamRequest{
		Files: []*filewritev1.StreamFile{declare(1, "dr/doomed"), declare(2, "dr/moved"), declare(3, "dr/kept")},
		Writes: []*filewritev1.StreamWrite{
			fileWrite(1, 1, 0, []byte("a"), 0), fileWrite(2, 2, 0, []byte("b"), 0), fileWrite(3, 3, 0, []byte("c"), 0),
		},
	})
	for id := uint64(1); id <= 3; id++ {
		if a := fs.ack(id); a.GetStatus() != nil {
			t.Fatalf("write %d: %v", id, a.GetStatus())
		}
	}
	// A fourth file is over --max-open-files while the three are held.
	fs.send(&filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(4, "dr/fourth")}})
	if got := fileReason(fs.file(4)); got != "TOO_MANY_OPEN_FILES" {
		t.Errorf("a fourth file with --max-open-files 3: %q, want TOO_MANY_OPEN_FILES", got)
	}
	if _, err := d.client.Delete(ctx, &filewritev1.DeleteRequest{Path: "dr/doomed"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Rename(ctx, &filewritev1.RenameRequest{Path: "dr/moved", NewPath: "dr/renamed"}); err != nil {
		t.Fatal(err)
	}
	fs.send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{
		fileWrite(1, 11, 1, []byte("A"), 0), fileWrite(2, 12, 1, []byte("B"), 0), fileWrite(3, 13, 1, []byte("C"), 0),
		fileWrite(4, 14, 0, []byte("D"), 0),
	}})
	for _, c := range []struct {
		id   uint64
		want string
	}{{11, "FILE_DELETED"}, {12, ""}, {13, ""}, {14, "TOO_MANY_OPEN_FILES"}} {
		if got := ackReason(fs.ack(c.id)); got != c.want {
			t.Errorf("write %d: reason %q, want %q", c.id, got, c.want)
		}
	}
	// Closing 1 and 4 frees index and open file: 4 is declared again, on
	// another file, and opens.
	fs.send(&filewritev1.WriteStreamRequest{Close: []uint32{1, 4}})
	fs.mu.Lock()
	delete(fs.files, 4)
	fs.mu.Unlock()
	fs.send(&filewritev1.WriteStreamRequest{
		Files:  []*filewritev1.StreamFile{declare(4, "dr/later")},
		Writes: []*filewritev1.StreamWrite{fileWrite(4, 15, 0, []byte("L"), 0), fileWrite(3, 16, 2, []byte("c"), 0)},
	})
	if s := fs.file(4); s.GetStatus() != nil {
		t.Errorf("file 4 declared again after the close: %v, want open", s.GetStatus())
	}
	for _, id := range []uint64{15, 16} {
		if a := fs.ack(id); a.GetStatus() != nil {
			t.Errorf("write %d: %v, want OK", id, a.GetStatus())
		}
	}
	fs.end()
	for name, want := range map[string]string{"dr/renamed": "bB", "dr/kept": "cCc", "dr/later": "L"} {
		if got := string(d.onDisk(t, name)); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	testutil.WaitFor(t, "the stream's files to be given back", func() bool {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "dr/a"})
		_, err2 := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "dr/b"})
		_, err3 := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "dr/c"})
		_, err4 := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "dr/d"})
		return err == nil && err2 == nil && err3 == nil && err4 == nil
	})
}

// TestStreamFilesBoundCRCAuth: a declaration past --max-files-per-stream
// fails with TOO_MANY_FILES_ON_STREAM (its writes acked with it) until a
// file is closed; a write whose CRC-32C is wrong fails alone; a file out
// of the credential's scope fails its declaration and its writes while
// the files in scope are written; bad indexes end the stream.
func TestStreamFilesBoundCRCAuth(t *testing.T) {
	const token = "files-token"
	tokens := testutil.WriteTokenFile(t, t.TempDir(), "tokens", token+" name=scoped prefix=mine/")
	d := startDaemon(t, func(c *Config) {
		c.MaxFilesPerStream = 2
		c.AuthTokenFile = tokens
	})
	ctx := metadata.AppendToOutgoingContext(testContext(t), "authorization", "Bearer "+token)
	fs := openFilesStream(t, ctx, d.client)
	bad := fileWrite(1, 2, 4, []byte("bad"), 0)
	*bad.Crc32C ^= 1
	fs.send(&filewritev1.WriteStreamRequest{
		Files: []*filewritev1.StreamFile{declare(1, "mine/a"), declare(2, "theirs/b"), declare(3, "mine/c")},
		Writes: []*filewritev1.StreamWrite{
			fileWrite(1, 1, 0, []byte("ok"), filewritev1.SyncMode_SYNC_MODE_DATA), bad,
			fileWrite(2, 3, 0, []byte("no"), 0), fileWrite(3, 4, 0, []byte("no"), 0),
		},
	})
	for _, c := range []struct {
		index uint32
		want  string
	}{{1, ""}, {2, "PERMISSION_DENIED_SCOPE"}, {3, "TOO_MANY_FILES_ON_STREAM"}} {
		if got := fileReason(fs.file(c.index)); got != c.want {
			t.Errorf("file %d: reason %q, want %q", c.index, got, c.want)
		}
	}
	for _, c := range []struct {
		id   uint64
		want string
	}{{1, ""}, {2, "CRC_MISMATCH"}, {3, "PERMISSION_DENIED_SCOPE"}, {4, "TOO_MANY_FILES_ON_STREAM"}} {
		if got := ackReason(fs.ack(c.id)); got != c.want {
			t.Errorf("write %d: reason %q, want %q", c.id, got, c.want)
		}
	}
	// Closing the refused file frees a place: mine/c opens.
	fs.send(&filewritev1.WriteStreamRequest{Close: []uint32{2, 3}})
	fs.mu.Lock()
	delete(fs.files, 3)
	fs.mu.Unlock()
	fs.send(&filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(3, "mine/c")},
		Writes: []*filewritev1.StreamWrite{fileWrite(3, 5, 0, []byte("c"), 0)}})
	if got := ackReason(fs.ack(5)); got != "" {
		t.Errorf("write 5 to mine/c once a place is free: %q, want OK", got)
	}
	// At the bound, one message closes an idle file and declares the next:
	// the file it closes does not count.
	fs.send(&filewritev1.WriteStreamRequest{Close: []uint32{1}, Files: []*filewritev1.StreamFile{declare(4, "mine/d")},
		Writes: []*filewritev1.StreamWrite{fileWrite(4, 6, 0, []byte("d"), 0)}})
	if got := ackReason(fs.ack(6)); got != "" {
		t.Errorf("write 6 to mine/d, declared as mine/a closes in one message: %q, want OK", got)
	}
	fs.end()
	if got := string(d.onDisk(t, "mine/a")); got != "ok" {
		t.Errorf("mine/a: %q, want %q", got, "ok")
	}

	for _, c := range []struct {
		name string
		msg  *filewritev1.WriteStreamRequest
	}{
		{"index 0 declared", &filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(0, "mine/x")}}},
		{"index declared twice", &filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(1, "mine/x"), declare(1, "mine/y")}}},
		{"write to an undeclared index", &filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(1, "mine/x")},
			Writes: []*filewritev1.StreamWrite{fileWrite(2, 1, 0, []byte("x"), 0)}}},
		{"write to index 0 without a path", &filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(1, "mine/x")},
			Writes: []*filewritev1.StreamWrite{fileWrite(0, 1, 0, []byte("x"), 0)}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := firstStreamError(ctx, d.client, nil, c.msg)
			if got := errorinfo.From(err).GetReason(); status.Code(err) != codes.InvalidArgument || got != "REQUEST_MALFORMED" {
				t.Errorf("%v (reason %s), want INVALID_ARGUMENT REQUEST_MALFORMED", err, got)
			}
		})
	}
}

// TestStreamFilesSlowSync: while one file's group commit is held, the
// other files' writes, synced or not, are acked.
func TestStreamFilesSlowSync(t *testing.T) {
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) { ffs = withFaultFS(c) })
	ctx := testContext(t)
	fs := openFilesStream(t, ctx, d.client)
	gate, open := gateOf(t)
	held := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpSync, Path: "slow/held", Hold: gate, Times: 1})
	fs.send(&filewritev1.WriteStreamRequest{
		Files:  []*filewritev1.StreamFile{declare(1, "slow/held"), declare(2, "slow/free")},
		Writes: []*filewritev1.StreamWrite{fileWrite(1, 1, 0, []byte("held"), filewritev1.SyncMode_SYNC_MODE_DATA)},
	})
	testutil.WaitFor(t, "file 1's sync to be held", func() bool { return held.Hits() == 1 })
	fs.send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{
		fileWrite(2, 2, 0, []byte("free"), 0), fileWrite(2, 3, 4, []byte("sync"), filewritev1.SyncMode_SYNC_MODE_DATA),
	}})
	for _, id := range []uint64{2, 3} {
		if a := fs.ack(id); a.GetStatus() != nil {
			t.Errorf("write %d: %v", id, a.GetStatus())
		}
	}
	fs.mu.Lock()
	early := fs.acks[1]
	fs.mu.Unlock()
	if early != nil {
		t.Errorf("write 1 acked while its sync is held: %v", early)
	}
	open()
	if a := fs.ack(1); a.GetStatus() != nil {
		t.Errorf("write 1: %v", a.GetStatus())
	}
	fs.end()
}

// TestStreamFilesHeldWrite: while writes to one file are held inside the
// store (as a lock wait would hold them), the workers they leave apply the
// other file's writes, which are acked.
func TestStreamFilesHeldWrite(t *testing.T) {
	var ffs **faultfs.FS
	d := startDaemon(t, func(c *Config) { ffs = withFaultFS(c) })
	ctx := testContext(t)
	fs := openFilesStream(t, ctx, d.client)
	gate, open := gateOf(t)
	held := (*ffs).Inject(faultfs.Rule{Op: faultfs.OpWrite, Path: "heldw/held", Hold: gate})
	m := &filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(1, "heldw/held"), declare(2, "heldw/free")}}
	// More writes to the held file than the stream has workers, none
	// overlapping: each could go at once.
	for id := range uint64(8) {
		m.Writes = append(m.Writes, fileWrite(1, id, int64(id)*8, []byte("held----"), 0))
	}
	fs.send(m)
	testutil.WaitFor(t, "a write to the held file to be held", func() bool { return held.Hits() >= 1 })
	fs.send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{fileWrite(2, 100, 0, []byte("free"), 0)}})
	if a := fs.ack(100); a.GetStatus() != nil {
		t.Errorf("write 100: %v", a.GetStatus())
	}
	open()
	for id := range uint64(8) {
		if a := fs.ack(id); a.GetStatus() != nil {
			t.Errorf("write %d: %v", id, a.GetStatus())
		}
	}
	fs.end()
}

// TestStreamFilesScopeReload: a reload of --auth-token-file that narrows
// the credential's scope away from one declared file fails that file's
// later writes with PERMISSION_DENIED; the file still in scope is written
// on, and the stream goes on.
func TestStreamFilesScopeReload(t *testing.T) {
	d, tokens := startTenantDaemon(t)
	wide := []byte(tokenAdmin + " name=admin\n" + tokenRW + " name=tenant-a prefix=tenants/ mode=rw\n")
	if err := os.WriteFile(tokens, wide, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.srv.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	ctx := withAuth(testContext(t), "Bearer "+tokenRW)
	fs := openFilesStream(t, ctx, d.client)
	fs.send(&filewritev1.WriteStreamRequest{
		Files:  []*filewritev1.StreamFile{declare(1, "tenants/a/kept.bin"), declare(2, "tenants/b/narrowed.bin")},
		Writes: []*filewritev1.StreamWrite{fileWrite(1, 1, 0, []byte("a"), 0), fileWrite(2, 2, 0, []byte("b"), 0)},
	})
	for _, id := range []uint64{1, 2} {
		if got := ackReason(fs.ack(id)); got != "" {
			t.Fatalf("write %d before the reload: %q", id, got)
		}
	}
	narrow := []byte(tokenAdmin + " name=admin\n" + tokenRW + " name=tenant-a prefix=tenants/a/ mode=rw\n")
	if err := os.WriteFile(tokens, narrow, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.srv.ReloadAuth(); err != nil {
		t.Fatal(err)
	}
	// The stream learns of the reload on its own goroutine: write until
	// file 2's writes are refused.
	id := uint64(3)
	testutil.WaitFor(t, "file 2's writes to be refused", func() bool {
		fs.send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{fileWrite(2, id, 1, []byte("B"), 0)}})
		got := ackReason(fs.ack(id))
		id++
		return got == "PERMISSION_DENIED_SCOPE"
	})
	fs.send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{fileWrite(1, id, 1, []byte("A"), 0)}})
	if got := ackReason(fs.ack(id)); got != "" {
		t.Errorf("file 1, still in scope, after the reload: %q, want OK", got)
	}
	fs.end()
	if got := string(d.onDisk(t, "tenants/a/kept.bin")); got != "aA" {
		t.Errorf("tenants/a/kept.bin: %q, want %q", got, "aA")
	}
}

// TestStreamFilesAppend: appends to declared files land at each file's
// end in arrival order, and each ack says where.
func TestStreamFilesAppend(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	fs := openFilesStream(t, ctx, d.client)
	fs.send(&filewritev1.WriteStreamRequest{Files: []*filewritev1.StreamFile{declare(1, "ap/one"), declare(2, "ap/two")}})
	want := map[uint32][]byte{}
	id := uint64(0)
	for range 10 {
		m := &filewritev1.WriteStreamRequest{}
		for f := uint32(1); f <= 2; f++ {
			data := []byte(fmt.Sprintf("%d:%d;", f, id))
			w := fileWrite(f, id, 0, data, 0)
			w.Append = true
			m.Writes = append(m.Writes, w)
			id++
			want[f] = append(want[f], data...)
		}
		fs.send(m)
	}
	fs.end()
	ends := map[uint32]int64{}
	for w := range id {
		a := fs.acks[w]
		if a == nil || a.GetStatus() != nil {
			t.Fatalf("append %d: ack %v, want OK", w, a)
		}
		f := uint32(w%2) + 1
		if a.GetOffset() != ends[f] {
			t.Errorf("append %d to file %d landed at %d, want %d (arrival order)", w, f, a.GetOffset(), ends[f])
		}
		ends[f] += a.GetBytesWritten()
	}
	for f, name := range map[uint32]string{1: "ap/one", 2: "ap/two"} {
		if got := d.onDisk(t, name); !bytes.Equal(got, want[f]) {
			t.Errorf("%s: %q, want %q", name, got, want[f])
		}
	}
}

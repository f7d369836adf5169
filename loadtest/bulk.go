package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/client"
)

// The bulk scenario (issue 33) measures bytes in bulk and durable small
// writes against what the disk and a plain program on it do, not against
// another server: each row's reference runs on the same disk, in
// alternation with filewrite, round after round.
//
//	bulk-put         a raw PUT of -file-size (1 GiB) with sync=data, vs dd bs=1M conv=fdatasync
//	bulk-writer      the client's File.NewWriter + io.Copy, then SyncData, vs the same dd
//	bulk-checkpoint  8 clients each writing a disjoint eighth of one file in 1 MiB writes, then
//	                 Sync, vs fio with 8 jobs over the same ranges (--offset_increment), --end_fsync=1
//	bulk-get         GET ?alt=media to curl, and the client's NewReader + io.Copy, vs
//	                 net/http.FileServer serving the same file to curl
//	bulk-durable     4 KiB writes at random blocks below EOF with SYNC_MODE_DATA, 32 in flight on
//	                 one stream, vs fio O_DIRECT|O_DSYNC, libaio, queue depth 32
//
// The writers of the first three rows read the same source file, written
// once and left in the page cache (dd reads it with if=, the PUT sends it,
// the Writer copies it), and write a file that does not exist when the run
// starts (dd's is removed before it, filewrite's deleted), or, for the
// checkpoint, one truncated to its size, all holes. A transfer row counts
// one operation per MiB moved, so its IOPS are MiB/s; its table prints
// MB/s (10^6 bytes, as dd does). Each row prints its goal (the issue's)
// and whether this run met it; the transfer rows that write also print
// the daemon's peak resident memory above its idle resident memory.

// bulkUnit is what one operation of a transfer row moves.
const bulkUnit = 1 << 20

// bulkRSSGoal is the most the daemon's resident memory may rise above its
// idle level while it takes a bulk write.
const bulkRSSGoal = 256 << 20

// bulkGoal is a ratio a row must reach: numerator's rate over
// denominator's, at least min.
type bulkGoal struct {
	ratio [2]string
	min   float64
}

// bulkNames are the bulk rows, each also a scenario of its own.
var bulkNames = []string{"bulk-put", "bulk-writer", "bulk-checkpoint", "bulk-get", "bulk-durable"}

// bulkMissing says which tool the bulk rows need is not installed, ""
// when all are.
func bulkMissing() string {
	for _, tool := range []string{"dd", "fio", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool
		}
	}
	return ""
}

// bulk returns the comparisons of the bulk row name, or of every row for
// "bulk".
func (e *env) bulk(name string) []func() *comparison {
	rows := map[string]func() *comparison{
		"bulk-put": e.bulkPut, "bulk-writer": e.bulkWriter, "bulk-checkpoint": e.bulkCheckpoint,
		"bulk-get": e.bulkGet, "bulk-durable": e.bulkDurable,
	}
	if name != "bulk" {
		return []func() *comparison{rows[name]}
	}
	var all []func() *comparison
	for _, n := range bulkNames {
		all = append(all, rows[n])
	}
	return all
}

// bulkPut: one raw PUT of the source with sync=data against dd. A daemon
// that refuses a body that large (REQUEST_TOO_LARGE, before it writes
// anything) gets it as PUTs of the largest size it takes, the last with
// sync=data, and the table says so.
func (e *env) bulkPut() *comparison {
	const path = "bulk/put.dat"
	size := e.fileSize(1<<30, bulkUnit)
	return e.bulkWrites("bulk-put", fmt.Sprintf("a raw PUT of %s with sync=data vs dd bs=1M conv=fdatasync", sizeName(size)), size,
		column{name: "filewrite-put", daemon: []string{"--http-addr", "127.0.0.1:0"}, transport: "http",
			before: deleteFile(path), run: withPeakRSS(putRun(e.bulkSourcePath(size), path, size))})
}

// bulkWriter: the client's Writer fed by io.Copy from the source, then
// SyncData (dd's fdatasync), against dd.
func (e *env) bulkWriter() *comparison {
	const path = "bulk/writer.dat"
	size := e.fileSize(1<<30, bulkUnit)
	return e.bulkWrites("bulk-writer", fmt.Sprintf("client File.NewWriter + io.Copy of %s, then SyncData, vs dd bs=1M conv=fdatasync", sizeName(size)), size,
		column{name: "filewrite-writer", daemon: []string{}, transport: transportStream,
			before: deleteFile(path), run: withPeakRSS(writerRun(e.bulkSourcePath(size), path, size))})
}

// bulkWrites is a row of one filewrite column against dd, both copying
// the source of size bytes into a new file.
func (e *env) bulkWrites(name, title string, size int64, fw column) *comparison {
	src := e.bulkSourcePath(size)
	fw.setup = bulkSource(src, size)
	return &comparison{
		name: name, title: title, clients: 1, bs: bulkUnit,
		preparation: fmt.Sprintf("both read one source file of %s, written once and left in the page cache; each run writes a file that does not exist when it starts (dd's removed, filewrite's deleted, untimed)", sizeName(size)),
		columns: []column{
			{name: "dd", setup: bulkSource(src, size), before: removeDD, run: ddRun(src, size)},
			fw,
		},
		ratios: [][2]string{{fw.name, "dd"}},
		print:  printBulkTable([]bulkGoal{{[2]string{fw.name, "dd"}, 0.8}}, true),
	}
}

// bulkCheckpoint: the checkpoint shape. Eight ranks each write their
// eighth of one file, in 1 MiB writes, then Sync: eight Clients (eight
// connections), against fio's eight jobs over the same ranges, each ending
// with an fsync. The file is truncated to 0 and then to its size before
// every run, on both sides: all holes, no dirty page.
func (e *env) bulkCheckpoint() *comparison {
	const path = "bulk/checkpoint.dat"
	const ranks = 8
	size := e.fileSize(1<<30, ranks*bulkUnit)
	return &comparison{
		name:        "bulk-checkpoint",
		title:       fmt.Sprintf("%d clients each writing a disjoint %s range of one %s file in 1m writes, then Sync, vs fio %d jobs, --end_fsync=1", ranks, sizeName(size/ranks), sizeName(size), ranks),
		preparation: fmt.Sprintf("truncated to 0, then to %s (all holes), before every run: ftruncate(2) for fio's, Truncate for filewrite's", sizeName(size)),
		clients:     ranks, bs: bulkUnit,
		columns: []column{
			{name: "fio", before: truncateRaw(size), run: fioCheckpoint(size, ranks)},
			{name: "filewrite-ranks", daemon: []string{}, transport: transportStream,
				before: func(ctx context.Context, s *session) error {
					if _, err := s.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: 0}); err != nil {
						return err
					}
					_, err := s.client.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: size})
					return err
				},
				run: withPeakRSS(checkpointRun(path, size, ranks))},
		},
		ratios: [][2]string{{"filewrite-ranks", "fio"}},
		print:  printBulkTable([]bulkGoal{{[2]string{"filewrite-ranks", "fio"}, 0.9}}, true),
	}
}

// bulkGet: downloads of one file, written through the daemon and synced
// once, from the page cache: the daemon's GET ?alt=media to curl and its
// client's Reader against Go's own net/http.FileServer serving the same
// file (in the harness, which is otherwise idle while curl reads) to the
// same curl.
func (e *env) bulkGet() *comparison {
	const path = "bulk/get.dat"
	size := e.fileSize(1<<30, bulkUnit)
	var root string // the daemon's root, once its column is set up
	fs := &fileServer{}
	url := func(s *session) string { return "http://" + s.daemon.httpAddr + "/v1/files/" + path + "?alt=media" }
	return &comparison{
		name:        "bulk-get",
		title:       fmt.Sprintf("downloads of a %s file from the page cache: GET ?alt=media and client NewReader vs net/http.FileServer, curl reading", sizeName(size)),
		preparation: fmt.Sprintf("one file of %s, copied in through the client's Writer and synced; every column reads that same file", sizeName(size)),
		clients:     1, bs: bulkUnit,
		columns: []column{
			{name: "filewrite-get", daemon: []string{"--http-addr", "127.0.0.1:0"}, transport: "http",
				setup: func(ctx context.Context, s *session) error {
					src := e.bulkSourcePath(size)
					if err := bulkSource(src, size)(ctx, s); err != nil {
						return err
					}
					root = s.daemon.root
					_, err := copyIn(ctx, s, src, path)
					return err
				},
				run: func(ctx context.Context, s *session) (*runResult, error) {
					return curlGet(ctx, url(s), size)
				}},
			{name: "filewrite-reader", daemon: []string{"--http-addr", "127.0.0.1:0"}, transport: transportStream, run: readerRun(path, size)},
			{name: "fileserver",
				setup: func(context.Context, *session) error { return fs.start(root) },
				run: func(ctx context.Context, s *session) (*runResult, error) {
					return curlGet(ctx, "http://"+fs.addr+"/"+path, size)
				}},
		},
		cleanup: fs.stop,
		ratios:  [][2]string{{"filewrite-get", "fileserver"}, {"filewrite-reader", "fileserver"}},
		print: printBulkTable([]bulkGoal{
			{[2]string{"filewrite-get", "fileserver"}, 0.9}, {[2]string{"filewrite-reader", "fileserver"}, 0.9}}, false),
	}
}

// bulkDurable: durable small writes near the device. 4 KiB writes at
// random blocks below EOF of a written 64 MiB file, each durable when
// acknowledged (client.SyncData, 32 callers sharing one stream) against
// fio's O_DIRECT|O_DSYNC writes at queue depth 32 (libaio): what the
// device does with the same writes made durable one by one. filewrite
// runs under --fsync group (the default), per-call, and with
// --synced-writes direct (each write made durable by itself).
func (e *env) bulkDurable() *comparison {
	const path = "bulk/durable.dat"
	const size = 64 << 20
	bs := e.bs(4 << 10)
	fw := func(name string, flags ...string) column {
		return column{name: name, daemon: append([]string{"--http-addr", "127.0.0.1:0"}, flags...), transport: transportStream,
			setup: func(ctx context.Context, s *session) error { return writeFile(ctx, s.client, path, size) },
			run:   countSyncs(clientWritesOver(path, size, client.SyncData, 1))}
	}
	return &comparison{
		name:        "bulk-durable",
		title:       fmt.Sprintf("random %s writes below EOF of a written %s file, each durable, queue depth %d, vs fio O_DIRECT|O_DSYNC libaio", sizeName(bs), sizeName(size), e.clients(32)),
		preparation: fmt.Sprintf("each written in full to %s in %s chunks (prepareChunk), then synced: pwrite(2)+fsync for fio's, Write+Fsync for filewrite's", sizeName(size), sizeName(prepareChunk)),
		clients:     e.clients(32), connections: 1, bs: bs,
		columns: []column{
			{name: "fio-dsync", setup: setupRawFile(size), run: fioDsync(size)},
			fw("filewrite-stream"),
			fw("filewrite-per-call", "--fsync", "per-call"),
			fw("filewrite-direct", "--synced-writes", "direct"),
		},
		ratios: [][2]string{{"filewrite-stream", "fio-dsync"}, {"filewrite-per-call", "fio-dsync"}, {"filewrite-direct", "fio-dsync"}},
		print: func(w io.Writer, res *comparisonResult) {
			printTable(w, res, columnNames(res))
			printGoals(w, res, []bulkGoal{{[2]string{"filewrite-stream", "fio-dsync"}, 0.8}})
		},
	}
}

// bulkSourcePath is the source file of the transfer rows of size bytes,
// shared by every row of the invocation.
func (e *env) bulkSourcePath(size int64) string {
	return filepath.Join(e.work, fmt.Sprintf("bulk-source-%d.dat", size))
}

// bulkSourceMu makes the first setup that needs a source write it, and
// the others wait for it.
var bulkSourceMu sync.Mutex

// bulkSource writes the source file src of size bytes (patternBytes, over
// and over) unless it is there already, and reads it through once so that
// it is in the page cache.
func bulkSource(src string, size int64) func(context.Context, *session) error {
	return func(context.Context, *session) error {
		bulkSourceMu.Lock()
		defer bulkSourceMu.Unlock()
		if fi, err := os.Stat(src); err == nil && fi.Size() == size {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(io.Discard, f)
			return err
		}
		f, err := os.Create(src)
		if err != nil {
			return err
		}
		data := patternBytes(bulkUnit)
		for off := int64(0); off < size; off += bulkUnit {
			if _, err := f.Write(data[:min(bulkUnit, size-off)]); err != nil {
				f.Close()
				return err
			}
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}

// transferResult is a run that moved n bytes in elapsed, as one operation
// per bulkUnit; err, if not nil, is its one error.
func transferResult(column, call string, n int64, elapsed time.Duration, err error) *runResult {
	errs := map[string]int{}
	if err != nil {
		errs[call+": "+err.Error()] = 1
	}
	r := loopResult(column, call, 1, elapsed, nil, errs)
	r.Count = uint64(n / bulkUnit)
	r.report.Count, r.report.Rps = r.Count, r.IOPS()
	r.pcts = map[float64]time.Duration{}
	return r
}

// ddOut is dd's output file in the column's directory.
func ddOut(s *session) string { return filepath.Join(s.dir, "dd.dat") }

// removeDD removes dd's output before a run, untimed, as filewrite's
// file is deleted.
func removeDD(_ context.Context, s *session) error {
	if err := os.Remove(ddOut(s)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ddRun copies src into a new file with dd bs=1M conv=fdatasync: the
// write and the fdatasync(2) after it are timed, as dd times them.
func ddRun(src string, size int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		dd := exec.CommandContext(ctx, "dd", "if="+src, "of="+ddOut(s), "bs=1M", "conv=fdatasync", "status=none")
		start := time.Now()
		out, err := dd.CombinedOutput()
		elapsed := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("dd: %w\n%s", err, out)
		}
		r := transferResult(s.column, "dd bs=1M conv=fdatasync", size, elapsed, nil)
		r.toolClient = processCPU(dd.ProcessState)
		s.done.Add(int64(r.Count))
		return r, nil
	}
}

// deleteFile deletes path through the daemon before a run, untimed, so
// that the run writes a new file; a path that names nothing is fine.
func deleteFile(path string) func(context.Context, *session) error {
	return func(ctx context.Context, s *session) error {
		_, err := s.client.Delete(ctx, &filewritev1.DeleteRequest{Path: path})
		if status.Code(err) != codes.NotFound && err != nil {
			return err
		}
		return nil
	}
}

// putRun PUTs the source to path with sync=data: in one request, or, if
// the daemon refuses one that large, in requests of the largest it takes
// (the limit its refusal names), the last with sync=data. A refused
// request writes nothing, and the clock starts again after it.
func putRun(src, path string, size int64) func(context.Context, *session) (*runResult, error) {
	piece := size
	return func(ctx context.Context, s *session) (*runResult, error) {
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		base := "http://" + s.daemon.httpAddr + "/v1/files/" + path
		call := "PUT"
		start := time.Now()
		for off := int64(0); off < size; {
			n := min(piece, size-off)
			q := "?offset=" + strconv.FormatInt(off, 10)
			if off+n == size {
				q += "&sync=data"
			}
			limit, err := put(ctx, base+q, io.NewSectionReader(f, off, n), n)
			switch {
			case err != nil:
				return transferResult(s.column, call, off, time.Since(start), err), nil
			case limit > 0:
				if off > 0 || limit >= piece || limit < bulkUnit {
					return nil, fmt.Errorf("PUT of %d bytes refused, the daemon's limit is %d bytes", n, limit)
				}
				piece = limit / bulkUnit * bulkUnit
				start = time.Now()
				continue
			}
			off += n
			s.done.Add(n / bulkUnit)
		}
		r := transferResult(s.column, call, size, time.Since(start), nil)
		if piece < size {
			r.Note = fmt.Sprintf("%d PUTs of %s, the last with sync=data: the daemon refused one of %s", (size+piece-1)/piece, sizeName(piece), sizeName(size))
		}
		return r, nil
	}
}

// put PUTs n bytes of body to url. A refusal of the body as too large
// returns the limit the daemon names (its ErrorInfo's), any other
// failure an error.
func put(ctx context.Context, url string, body io.Reader, n int64) (limit int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, body)
	if err != nil {
		return 0, err
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 == 2 {
		return 0, nil
	}
	var st struct {
		Details []struct {
			Reason   string            `json:"reason"`
			Metadata map[string]string `json:"metadata"`
		} `json:"details"`
	}
	if json.Unmarshal(msg, &st) == nil {
		for _, d := range st.Details {
			if d.Reason == filewritev1.ErrorReason_REQUEST_TOO_LARGE.String() {
				if l, err := strconv.ParseInt(d.Metadata["limit"], 10, 64); err == nil && l > 0 {
					return l, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
}

// dialBulk dials the session's daemon with the client package.
func dialBulk(s *session) (*client.Client, error) {
	var opts []client.Option
	if s.token != "" {
		opts = append(opts, client.WithToken(s.token))
	}
	return client.Dial(dialTarget(s.addr), opts...)
}

// copyIn copies src into path through the client's Writer and syncs it
// (SyncData), returning how many bytes it copied.
func copyIn(ctx context.Context, s *session, src, path string) (int64, error) {
	c, err := dialBulk(s)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	f, err := c.Open(ctx, path)
	if err != nil {
		return 0, err
	}
	in, err := os.Open(src)
	if err != nil {
		f.Close()
		return 0, err
	}
	defer in.Close()
	w := f.NewWriter(0)
	n, err := io.Copy(w, in)
	err = errors.Join(err, w.Close())
	if err == nil {
		err = f.SyncData(ctx)
	}
	return n, errors.Join(err, f.Close())
}

// writerRun is copyIn, timed from the dial to the end of the sync.
func writerRun(src, path string, size int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		start := time.Now()
		n, err := copyIn(ctx, s, src, path)
		elapsed := time.Since(start)
		if err == nil && n != size {
			err = fmt.Errorf("copied %d bytes, want %d", n, size)
		}
		s.done.Add(n / bulkUnit)
		return transferResult(s.column, "client Writer + io.Copy, SyncData", size, elapsed, err), nil
	}
}

// truncateRaw truncates the column's raw file to 0, then to size: every
// block a hole, nothing cached.
func truncateRaw(size int64) func(context.Context, *session) error {
	return func(_ context.Context, s *session) error {
		f, err := os.OpenFile(rawFile(s), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		err = errors.Join(f.Truncate(0), f.Truncate(size), f.Sync())
		return errors.Join(err, f.Close())
	}
}

// fioCheckpoint is fio's checkpoint: ranks jobs, job i writing the i-th
// of ranks equal ranges of the column's raw file sequentially in 1 MiB
// pwrites, then fsync (--end_fsync). The raw file is sized already
// (truncateRaw): fio lays nothing out. Timed from fio's start to its exit,
// as filewrite's ranks are from their dial to their last Sync.
func fioCheckpoint(size int64, ranks int) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		part := strconv.FormatInt(size/int64(ranks), 10)
		out := filepath.Join(s.dir, fmt.Sprintf("fio-checkpoint-r%d.json", s.round))
		fio := exec.CommandContext(ctx, "fio", "--name=checkpoint", "--filename="+rawFile(s), "--rw=write", "--bs=1M",
			"--ioengine=psync", "--numjobs="+strconv.Itoa(ranks), "--size="+part, "--offset_increment="+part,
			"--end_fsync=1", "--fallocate=none", "--invalidate=0", "--group_reporting",
			"--output-format=json", "--output="+out)
		start := time.Now()
		msg, err := fio.CombinedOutput()
		elapsed := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("fio: %w\n%s", err, msg)
		}
		r := transferResult(s.column, "fio --rw=write --end_fsync=1", size, elapsed, nil)
		r.toolClient = processCPU(fio.ProcessState)
		s.done.Add(int64(r.Count))
		return r, nil
	}
}

// checkpointRun is the checkpoint through filewrite: ranks Clients, each
// its own connection and File, rank i writing the i-th of ranks equal
// ranges of path in 1 MiB WriteAts, then Sync. Timed from the first dial
// to the last Sync.
func checkpointRun(path string, size int64, ranks int) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		data := patternBytes(bulkUnit)
		part := size / int64(ranks)
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range ranks {
			wg.Go(func() {
				errs[i] = func() error {
					c, err := dialBulk(s)
					if err != nil {
						return err
					}
					defer c.Close()
					f, err := c.Open(ctx, path)
					if err != nil {
						return err
					}
					for off := int64(i) * part; off < int64(i+1)*part; off += bulkUnit {
						if _, err := f.WriteAt(data, off); err != nil {
							f.Close()
							return err
						}
						s.done.Add(1)
					}
					return errors.Join(f.Sync(ctx), f.Close())
				}()
			})
		}
		wg.Wait()
		return transferResult(s.column, "client WriteAt 1m, then Sync, per rank", size, time.Since(start), errors.Join(errs...)), nil
	}
}

// curlGet downloads url with curl into /dev/null and checks that it got
// size bytes; curl's CPU time counts as the harness's.
func curlGet(ctx context.Context, url string, size int64) (*runResult, error) {
	curl := exec.CommandContext(ctx, "curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{size_download}", url)
	start := time.Now()
	out, err := curl.Output()
	elapsed := time.Since(start)
	if err == nil {
		if got, perr := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); perr != nil || got != size {
			err = fmt.Errorf("got %s bytes, want %d", out, size)
		}
	}
	r := transferResult("", "curl GET", size, elapsed, err)
	r.toolClient = processCPU(curl.ProcessState)
	return r, nil
}

// readerRun reads path through the client's Reader into io.Discard,
// timed from the dial.
func readerRun(path string, size int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		start := time.Now()
		n, err := func() (int64, error) {
			c, err := dialBulk(s)
			if err != nil {
				return 0, err
			}
			defer c.Close()
			f, err := c.Open(ctx, path, client.WithOpenMode(client.OpenMustExist))
			if err != nil {
				return 0, err
			}
			n, err := io.Copy(io.Discard, f.NewReader(0))
			return n, errors.Join(err, f.Close())
		}()
		elapsed := time.Since(start)
		if err == nil && n != size {
			err = fmt.Errorf("read %d bytes, want %d", n, size)
		}
		s.done.Add(n / bulkUnit)
		return transferResult(s.column, "client Reader + io.Copy", size, elapsed, err), nil
	}
}

// fileServer is Go's net/http.FileServer on a loopback port, serving a
// directory: the reference of the downloads.
type fileServer struct {
	srv  *http.Server
	addr string
}

func (f *fileServer) start(root string) error {
	if root == "" {
		return errors.New("fileserver: no daemon root to serve (its column is set up first)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	f.srv = &http.Server{Handler: http.FileServer(http.Dir(root)), ReadHeaderTimeout: 10 * time.Second}
	f.addr = ln.Addr().String()
	go f.srv.Serve(ln)
	return nil
}

func (f *fileServer) stop() error {
	if f.srv == nil {
		return nil
	}
	return f.srv.Close()
}

// fioDsync is fio's durable random writes on the column's raw file:
// O_DIRECT|O_DSYNC (each write durable when it completes), libaio,
// s.clients in flight from one job.
func fioDsync(fileSize int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		return runFio(ctx, s, "dsync", "--ioengine=libaio", "--direct=1", "--sync=dsync",
			"--iodepth="+strconv.Itoa(s.clients), "--filename="+rawFile(s), "--size="+strconv.FormatInt(fileSize, 10))
	}
}

// rssIdle keeps, per daemon process, the least resident memory seen
// before a run: its idle level.
var rssIdle = struct {
	sync.Mutex
	byPID map[int]int64
}{byPID: map[int]int64{}}

// withPeakRSS measures the daemon's peak resident memory during run,
// above its idle level (the least it held before any run so far): the
// kernel's high-water mark (VmHWM) is reset before the run (clear_refs
// 5) and read after it.
func withPeakRSS(run func(context.Context, *session) (*runResult, error)) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		if s.pid == 0 {
			return run(ctx, s)
		}
		m, err := procMemory(s.pid)
		if err != nil {
			return nil, err
		}
		rssIdle.Lock()
		idle, ok := rssIdle.byPID[s.pid]
		if !ok || m.RSS < idle {
			idle = m.RSS
			rssIdle.byPID[s.pid] = idle
		}
		rssIdle.Unlock()
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.pid), []byte("5"), 0); err != nil {
			return nil, fmt.Errorf("reset the daemon's peak RSS: %w", err)
		}
		r, err := run(ctx, s)
		if err != nil {
			return r, err
		}
		if m, err = procMemory(s.pid); err != nil {
			return nil, err
		}
		r.RSSAboveIdle = m.PeakRSS - idle
		return r, nil
	}
}

// printBulkTable prints a transfer row: MB/s (medians over rounds, and
// each round's), the ratios, CPU per MiB, other load, the daemon's peak
// resident memory above idle where measured, and each goal met or not;
// memory says whether the row has the memory goal.
func printBulkTable(goals []bulkGoal, memory bool) func(io.Writer, *comparisonResult) {
	return func(w io.Writer, res *comparisonResult) {
		rows, row := tableRows(res, columnNames(res))
		mbps := func(iops float64) string { return strconv.FormatFloat(iops*bulkUnit/1e6, 'f', 0, 64) }
		row("MB/s", func(c *columnSummary) string { return mbps(c.IOPS) }, func(r *ratioSummary) string { return fmt.Sprintf("%.2fx", r.IOPS) })
		row("MB/s by round", roundCells(mbps), roundRatios)
		row("errors", errorCells, nil)
		row("cpu/MiB daemon (usec)", func(c *columnSummary) string { return dashIfZero(c.CPU.ServerUS, 0) }, nil)
		row("cpu/MiB harness, tools (usec)", func(c *columnSummary) string { return dashIfZero(c.CPU.ClientUS, 0) }, nil)
		loadRows(res, row)
		if memory {
			row("daemon RSS above idle, peak (MiB)", func(c *columnSummary) string {
				if c.RSSAboveIdle == 0 {
					return "-"
				}
				return strconv.FormatFloat(float64(c.RSSAboveIdle)/(1<<20), 'f', 0, 64)
			}, nil)
		}
		fmt.Fprintf(w, "   one transfer per run, %d rounds alternating; medians over rounds\n", res.Rounds)
		printRows(w, *rows)
		for _, c := range res.Columns {
			if c.Note != "" {
				fmt.Fprintf(w, "   %s: %s\n", c.Name, c.Note)
			}
		}
		printErrors(w, res)
		printGoals(w, res, goals)
		if memory {
			var peak int64
			for _, c := range res.Columns {
				peak = max(peak, c.RSSAboveIdle)
			}
			fmt.Fprintf(w, "   goal: the daemon's RSS < %d MiB above idle during the run: %.0f MiB, %s\n",
				bulkRSSGoal>>20, float64(peak)/(1<<20), metOrNot(peak < bulkRSSGoal))
		}
	}
}

// columnNames are the names of res's columns, in order.
func columnNames(res *comparisonResult) []string {
	var names []string
	for _, c := range res.Columns {
		names = append(names, c.Name)
	}
	return names
}

// printGoals prints each goal of a row, met or not by the median ratio.
func printGoals(w io.Writer, res *comparisonResult, goals []bulkGoal) {
	for _, g := range goals {
		name := g.ratio[0] + "/" + g.ratio[1]
		for _, r := range res.Ratios {
			if r.Name == name {
				fmt.Fprintf(w, "   goal: %s >= %.2fx: %.2fx, %s\n", name, g.min, r.IOPS, metOrNot(r.IOPS >= g.min && !res.Failed))
			}
		}
	}
}

func metOrNot(met bool) string {
	if met {
		return "met"
	}
	return "NOT MET"
}

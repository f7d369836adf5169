package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// prepareChunk is the size of the writes that fill a file before a run.
const prepareChunk = 1 << 20

// writeFile makes path a fully written file of size bytes through the
// service, and makes it durable, so that a run starts on written blocks
// with nothing dirty in the page cache.
func writeFile(ctx context.Context, c filewritev1.FileServiceClient, path string, size int64) error {
	if _, err := c.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: 0}); err != nil {
		return err
	}
	data := patternBytes(prepareChunk)
	for off := int64(0); off < size; off += prepareChunk {
		n := min(int64(prepareChunk), size-off)
		if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: data[:n]}); err != nil {
			return err
		}
	}
	_, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: path})
	return err
}

// fallocateFile makes path a freshly fallocated file of size bytes: every
// block allocated and unwritten, none written, as the ext4 experiment
// starts. Truncating to 0 first frees what an earlier run wrote.
func fallocateFile(ctx context.Context, c filewritev1.FileServiceClient, path string, size int64) error {
	if _, err := c.Truncate(ctx, &filewritev1.TruncateRequest{Path: path, Size: 0}); err != nil {
		return err
	}
	_, err := c.Fallocate(ctx, &filewritev1.FallocateRequest{
		Path: path, Mode: filewritev1.FallocateMode_FALLOCATE_MODE_ALLOCATE, Offset: 0, Length: size})
	return err
}

func fsyncFile(ctx context.Context, c filewritev1.FileServiceClient, path string) error {
	_, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: path, DataOnly: true})
	return err
}

// patternBytes is n bytes that are not all zeros.
func patternBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// ghzWrites is a run of bs-byte Writes at random block-aligned offsets
// below fileSize, driven by ghz.
func ghzWrites(path string, fileSize int64, sync filewritev1.SyncMode) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		enc, err := newWriteEncoder(path, s.bs, sync)
		if err != nil {
			return nil, err
		}
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		return ghzRun{
			call: callWrite, addr: s.addr, token: s.token, clients: s.clients, connections: s.connections, duration: s.duration, done: s.done,
			message: func(n int64) []byte { return enc.encode(randomBlock(seed, n, blocks) * bs) },
		}.run(ctx, "")
	}
}

// ghzHealthChecks is a run of the health Check, the cheapest real RPC the
// daemon serves: through the same gRPC server, interceptors and stats
// handler as every FileService call, but touching no file.
func ghzHealthChecks(ctx context.Context, s *session) (*runResult, error) {
	empty := delimited(nil)
	return ghzRun{
		call: callHealthCheck, addr: s.addr, token: s.token, clients: s.clients, connections: s.connections, duration: s.duration, done: s.done,
		message: func(int64) []byte { return empty },
	}.run(ctx, "")
}

// loop runs op from s.clients goroutines until s.duration has passed, like
// a ghz run (calls in flight at the end are waited for), for the workloads
// ghz cannot drive: several RPCs per operation, or no RPC at all. n numbers
// the operations across clients from 0, as ghz numbers its requests.
func loop(ctx context.Context, s *session, call string, op func(ctx context.Context, client int, n int64) error) *runResult {
	return loopN(ctx, s, call, -1, op)
}

// loopN is loop, but with limit >= 0 the run ends once operations 0 to
// limit-1 are done, however long that takes, rather than after
// s.duration.
func loopN(ctx context.Context, s *session, call string, limit int64, op func(ctx context.Context, client int, n int64) error) *runResult {
	var next atomic.Int64
	var mu sync.Mutex
	var all []time.Duration
	errs := map[string]int{}
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(s.duration)
	for c := range s.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lats := make([]time.Duration, 0, 1024)
			myErrs := map[string]int{}
			for ctx.Err() == nil && (limit >= 0 || time.Now().Before(deadline)) {
				n := next.Add(1) - 1
				if limit >= 0 && n >= limit {
					break
				}
				t0 := time.Now()
				err := op(ctx, c, n)
				if err != nil {
					myErrs[err.Error()]++
				} else {
					lats = append(lats, time.Since(t0))
				}
				s.done.Add(1)
			}
			mu.Lock()
			all = append(all, lats...)
			for k, v := range myErrs {
				errs[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return loopResult("", call, s.clients, time.Since(start), all, errs)
}

// dial connects to the daemon at addr in plaintext; every call sends token
// as its bearer token, unless token is "".
func dial(addr, token string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(token)))
	}
	return grpc.NewClient(dialTarget(addr), opts...)
}

// dialTarget is the gRPC target for a daemon's address as it logs it:
// host:port, or the path of a unix socket (--grpc-addr unix:PATH).
func dialTarget(addr string) string {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		addr = path
	}
	if strings.HasPrefix(addr, "/") {
		return "unix://" + addr
	}
	return "passthrough:///" + addr
}

// bearerToken is the "authorization" metadata the daemon's
// --auth-token-file asks for.
type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is false: the harness speaks plaintext, to a
// daemon on loopback or on a network the operator trusts.
func (bearerToken) RequireTransportSecurity() bool { return false }

// dialClients returns n clients over conns connections (0: one each), as
// the ghz runs spread their clients.
func dialClients(addr, token string, n, conns int) ([]filewritev1.FileServiceClient, func(), error) {
	var ccs []*grpc.ClientConn
	closeAll := func() {
		for _, c := range ccs {
			c.Close()
		}
	}
	if conns <= 0 || conns > n {
		conns = n
	}
	var clients []filewritev1.FileServiceClient
	for i := range n {
		if i < conns {
			cc, err := dial(addr, token)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			ccs = append(ccs, cc)
		}
		clients = append(clients, filewritev1.NewFileServiceClient(ccs[i%conns]))
	}
	return clients, closeAll, nil
}

// writeThenFsync is the fsync experiment's operation, run by the harness's
// own loop because ghz calls one method per run: each client writes bs
// bytes at a random block below fileSize, then Fsyncs the file (data
// only), and one operation is the pair, timed together.
func writeThenFsync(path string, fileSize int64) func(context.Context, *session) (*runResult, error) {
	return unaryRun(func(ctx context.Context, s *session, clients []filewritev1.FileServiceClient, data []byte) *runResult {
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		return loop(ctx, s, "Write+Fsync", func(ctx context.Context, client int, n int64) error {
			c := clients[client]
			off := randomBlock(seed, n, blocks) * bs
			if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: path, Offset: off, Data: data}); err != nil {
				return fmt.Errorf("Write: %w", err)
			}
			if _, err := c.Fsync(ctx, &filewritev1.FsyncRequest{Path: path, DataOnly: true}); err != nil {
				return fmt.Errorf("Fsync: %w", err)
			}
			return nil
		})
	})
}

// unaryRun is a run of the harness's own loop over s.clients unary
// clients, dialled for it (dialClients) and closed after it: run gets
// them, and data, a pattern of s.bs bytes for their writes.
func unaryRun(run func(ctx context.Context, s *session, clients []filewritev1.FileServiceClient, data []byte) *runResult) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		clients, closeAll, err := dialClients(s.addr, s.token, s.clients, s.connections)
		if err != nil {
			return nil, err
		}
		defer closeAll()
		return run(ctx, s, clients, patternBytes(s.bs)), nil
	}
}

// rawFile is the harness's own file for the raw pwrite column, in the
// column's directory on the same filesystem as the daemons' roots.
func rawFile(s *session) string { return filepath.Join(s.dir, "raw.dat") }

// setupRawFile writes the raw pwrite column's file in full and syncs it,
// as writeFile does through the service.
func setupRawFile(fileSize int64) func(context.Context, *session) error {
	return func(ctx context.Context, s *session) error {
		f, err := os.OpenFile(rawFile(s), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		data := patternBytes(prepareChunk)
		for off := int64(0); off < fileSize; off += prepareChunk {
			if _, err := f.WriteAt(data[:min(int64(prepareChunk), fileSize-off)], off); err != nil {
				return err
			}
		}
		return f.Sync()
	}
}

// rawPwrites is the ceiling of the throughput experiment: the same writes
// as the service's, pwrite(2) from s.clients goroutines in the harness.
func rawPwrites(fileSize int64) func(context.Context, *session) (*runResult, error) {
	return func(ctx context.Context, s *session) (*runResult, error) {
		f, err := os.OpenFile(rawFile(s), os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		data := patternBytes(s.bs)
		blocks, bs, seed := fileSize/int64(s.bs), int64(s.bs), uint64(s.round)
		r := loop(ctx, s, "pwrite(2)", func(_ context.Context, _ int, n int64) error {
			_, err := f.WriteAt(data, randomBlock(seed, n, blocks)*bs)
			return err
		})
		return r, nil
	}
}

// syncRawFile flushes what a raw run dirtied, untimed, so that the next
// run does not pay for this one's writeback.
func syncRawFile(_ context.Context, s *session) error {
	f, err := os.OpenFile(rawFile(s), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

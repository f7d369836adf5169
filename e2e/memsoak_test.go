package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// memorySoakEnv turns TestMemorySoak on; it takes minutes and gigabytes.
const memorySoakEnv = "FILEWRITE_MEMORY_SOAK"

// memorySoakOverhead is what the daemon's resident memory may pass
// --max-inflight-bytes by, with 64 of the largest requests in flight: the
// Go runtime, the code, the pools of buffers grpc-go and net/http keep,
// garbage the collector has not reached yet, and what the budget does not
// count (the flow-control windows of connections, one chunk per streaming
// REST request, the connections themselves).
const memorySoakOverhead = 512 << 20

// procStatusKB reads a field of /proc/pid/status, in KiB.
func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// TestMemorySoak runs the daemon binary and keeps 64 requests of 64 MiB in
// flight for several rounds, over gRPC and REST: Writes and Reads, raw PUTs
// and reads, JSON writes and reads. The daemon's peak resident memory
// (VmHWM) must stay under --max-inflight-bytes plus memorySoakOverhead.
// Set FILEWRITE_MEMORY_SOAK=1 to run it, and FILEWRITE_MEMORY_SOAK_BUDGET
// to try another --max-inflight-bytes (default 1GiB); run it without -race,
// which multiplies memory.
func TestMemorySoak(t *testing.T) {
	if os.Getenv(memorySoakEnv) == "" {
		t.Skipf("set %s=1 to run the memory soak (minutes, gigabytes)", memorySoakEnv)
	}
	budget := "1g"
	if b := os.Getenv(memorySoakEnv + "_BUDGET"); b != "" {
		budget = b
	}
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv(memorySoakEnv + "_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	dir := testutil.Dir(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	proc, logs := testutil.StartDaemon(t, ctx, daemonBin, "--root", filepath.Join(dir, "root"),
		"--max-inflight-bytes", budget)
	grpcAddr, httpAddr := proc.GRPCAddr, proc.HTTPAddr
	var budgetBytes int64
	for _, line := range strings.Split(logs.String(), "\n") {
		if _, v, ok := strings.Cut(line, "max_inflight_bytes="); ok {
			budgetBytes, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	if budgetBytes == 0 {
		t.Fatalf("the daemon did not log max_inflight_bytes:\n%s", logs)
	}
	pid := proc.Pid()

	const size = 64 << 20
	data := allBytes(size)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := filewritev1.NewFileServiceClient(conn)
	// Files to read, written before the measure starts.
	for i := range 4 {
		if _, err := c.Write(ctx, &filewritev1.WriteRequest{Path: fmt.Sprintf("src/%d.bin", i), Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	base, err := procStatusKB(pid, "VmRSS")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}

	// The clients share encoded messages and bodies, so that the test's
	// own memory does not grow with the number of requests.
	writeMsgs := make([]*testutil.OnceEncoded, 16)
	for i := range writeMsgs {
		msg := &filewritev1.WriteRequest{Path: fmt.Sprintf("grpc/%d.bin", i), Data: data}
		wire, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		writeMsgs[i] = &testutil.OnceEncoded{Msg: msg, Wire: wire}
	}
	jsonBody := []byte(`{"data":"` + base64.StdEncoding.EncodeToString(data) + `"}`)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	do := func(method, url string, body []byte, header ...string) error {
		var r io.Reader
		if body != nil {
			r = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, "http://"+httpAddr+url, r)
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated { // 201: a PUT created its file
			return fmt.Errorf("%s %s: %s", method, url, resp.Status)
		}
		if method == "GET" && n < size {
			return fmt.Errorf("GET %s: %d bytes", url, n)
		}
		return nil
	}
	type client struct {
		name string
		n    int
		call func(i int) error
	}
	clients := []client{
		{"gRPC Write", 16, func(i int) error {
			m := writeMsgs[i]
			_, err := c.Write(ctx, m.Msg.(*filewritev1.WriteRequest), grpc.ForceCodecV2(m))
			return err
		}},
		{"gRPC Read", 16, func(i int) error {
			resp, err := c.Read(ctx, &filewritev1.ReadRequest{Path: fmt.Sprintf("src/%d.bin", i%4), Length: size})
			if err == nil && len(resp.GetData()) != size {
				err = fmt.Errorf("read %d bytes", len(resp.GetData()))
			}
			return err
		}},
		{"REST raw PUT", 16, func(i int) error {
			return do("PUT", fmt.Sprintf("/v1/files/raw/%d.bin", i), data, "Content-Type", mimeOctetStream)
		}},
		{"REST raw read", 8, func(i int) error {
			return do("GET", fmt.Sprintf("/v1/files/src/%d.bin:read?length=%d", i%4, size), nil, "Accept", mimeOctetStream)
		}},
		{"REST JSON write", 4, func(i int) error {
			return do("POST", fmt.Sprintf("/v1/files/json/%d.bin:write", i), jsonBody, "Content-Type", "application/json")
		}},
		{"REST JSON read", 4, func(i int) error {
			return do("GET", fmt.Sprintf("/v1/files/src/%d.bin:read?length=%d", i%4, size), nil)
		}},
	}

	var peakRSS atomic.Int64
	sampled := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if kb, err := procStatusKB(pid, "VmRSS"); err == nil && kb > peakRSS.Load() {
				peakRSS.Store(kb)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	var failures atomic.Int64
	total := 0
	only := os.Getenv(memorySoakEnv + "_ONLY") // client kinds, comma-separated, to measure them alone
	for _, cl := range clients {
		if only != "" && !strings.Contains(only, cl.name) {
			continue
		}
		total += cl.n
		for i := range cl.n {
			wg.Go(func() {
				for r := range rounds {
					if err := cl.call(i); err != nil {
						failures.Add(1)
						t.Errorf("%s %d, round %d: %v", cl.name, i, r, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	<-sampled
	elapsed := time.Since(start)
	hwm, err := procStatusKB(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	limit := budgetBytes + memorySoakOverhead
	t.Logf("%d clients x %d rounds of 64 MiB requests in %v (%.0f MiB/s): daemon RSS %d MiB before, peak %d MiB sampled, VmHWM %d MiB; "+
		"--max-inflight-bytes %d MiB + overhead %d MiB = %d MiB",
		total, rounds, elapsed.Round(time.Millisecond), float64(total*rounds*size)/elapsed.Seconds()/(1<<20),
		base>>10, peakRSS.Load()>>10, hwm>>10, budgetBytes>>20, memorySoakOverhead>>20, limit>>20)
	if hwm<<10 > limit {
		t.Errorf("peak resident memory %d MiB passes --max-inflight-bytes plus the stated overhead, %d MiB", hwm>>10, limit>>20)
	}
	if failures.Load() > 0 {
		t.Errorf("%d clients failed", failures.Load())
	}
}

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/streamwire"
	"github.com/filewrite/filewrite/internal/testutil"
)

// This file sends what a peer can send cheaply and the daemon once paid
// dearly for: gRPC calls that send their headers and never their message,
// REST bodies that never come, and WriteStream messages of very many
// empty writes. The bounds they are held to are docs/guarantees.md's.

// maxConcurrentStreams is the daemon's bound on the calls of one
// connection (service's).
const maxConcurrentStreams = 128

// rawCodec sends a []byte as the message, byte for byte.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// emptyWrites is a WriteStreamRequest for path of n empty writes, ids 0,
// 1, 2, ... if distinct, else all 0: 2 or 3 to 5 bytes a write.
func emptyWrites(path string, n int, distinct bool) []byte {
	var b []byte
	if path != "" {
		b = protowire.AppendString(protowire.AppendTag(b, streamwire.FieldRequestPath, protowire.BytesType), path)
	}
	for i := range n {
		b = protowire.AppendTag(b, streamwire.FieldRequestWrites, protowire.BytesType)
		if !distinct || i == 0 {
			b = protowire.AppendVarint(b, 0)
			continue
		}
		b = protowire.AppendVarint(b, uint64(protowire.SizeTag(streamwire.FieldWriteID)+protowire.SizeVarint(uint64(i))))
		b = protowire.AppendTag(b, streamwire.FieldWriteID, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(i))
	}
	return b
}

// sendRaw opens a WriteStream, sends msg as it is, half-closes, and
// returns how the stream ended.
func sendRaw(ctx context.Context, conn *grpc.ClientConn, msg []byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		filewritev1.FileService_WriteStream_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	if err := stream.SendMsg(&msg); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	stream.CloseSend()
	for {
		var resp []byte
		if err := stream.RecvMsg(&resp); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// procCPU is the CPU time a process has used, user and system, from
// /proc/pid/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: utime and stime are the 12th and 13th of them.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ is 100 on Linux
}

// attackSoakEnv sets how long TestAttackSoak runs (a Go duration); a
// couple of seconds without it.
const attackSoakEnv = "FILEWRITE_ATTACK_SOAK"

// The bounds of docs/guarantees.md that TestAttackSoak checks, with room
// for what they leave out (the Go runtime's own slack, garbage between
// collections): the daemon holds what it was sent at most
// attackBytesFactor times over, plus attackAllowance; and spends at most
// attackCPUPerMiB of CPU per MiB an attacker sent (the old decoder spent
// about 100 s on a 0.6 MiB message), plus what the legitimate client's
// writes cost.
const (
	attackBytesFactor = 3
	attackAllowance   = 128 << 20
	attackCPUPerMiB   = 20 * time.Millisecond
	legitCPUPerWrite  = 20 * time.Millisecond
)

// TestAttackSoak runs the daemon binary, sends it the three attacks at
// once, and keeps a legitimate client writing meanwhile: gRPC calls that
// send their headers and never their message, on a connection that
// answers pings; REST JSON bodies that stall; and WriteStream messages
// of 100k empty writes with distinct ids (quadratic in the old write
// order) and of 4M empty writes (1.4 GiB of records in the old decoder).
// Every legitimate write succeeds, health stays SERVING, the attack
// messages are refused INVALID_ARGUMENT, and the daemon's peak memory and
// CPU stay within the bounds above, measured on the process. It runs a
// few seconds; set FILEWRITE_ATTACK_SOAK=10m to soak.
func TestAttackSoak(t *testing.T) {
	length := soakLength(t, attackSoakEnv, 2*time.Second)
	const maxRequest = 4 << 20
	dir := testutil.Dir(t)
	// Without -race whatever the test runs with: the bounds are the
	// daemon's, and the race detector multiplies memory and CPU.
	bin := testutil.BuildDaemon(t, dir, false)
	ctx, cancel := context.WithTimeout(t.Context(), length+5*time.Minute)
	defer cancel()
	proc, _ := testutil.StartDaemon(t, ctx, bin, "--root", filepath.Join(dir, "root"),
		"--max-request-bytes", strconv.Itoa(maxRequest), "--max-inflight-bytes", "16m")
	pid := proc.Pid()
	conn, err := grpc.NewClient(proc.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	files := filewritev1.NewFileServiceClient(conn)
	health := healthpb.NewHealthClient(conn)
	legit := allBytes(256 << 10)
	if _, err := files.Write(ctx, &filewritev1.WriteRequest{Path: "warm.bin", Data: legit}); err != nil {
		t.Fatal(err)
	}
	baseRSS, err := procStatusKB(pid, "VmRSS")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	baseCPU, err := procCPU(pid)
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var attackBytes, legitWrites, refused atomic.Int64
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
	}

	// Stalled gRPC calls: as many as a connection may carry, on two
	// connections, each announcing a message at the limit.
	for range 2 {
		testutil.OpenStalledCalls(t, proc.GRPCAddr).Open(t, 1, maxConcurrentStreams, filewritev1.FileService_Write_FullMethodName, maxRequest)
	}
	// Stalled REST bodies.
	for i := range 8 {
		pr, pw := io.Pipe()
		defer pw.Close()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s/v1/files/stalled%d:write", proc.HTTPAddr, i), pr)
		req.Header.Set("Content-Type", "application/json")
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		go io.WriteString(pw, `{"data":"`)
	}
	// The two WriteStream messages, each refused.
	for _, msg := range [][]byte{
		emptyWrites("quadratic.bin", 100_000, true),
		emptyWrites("records.bin", maxRequest, false), // 8 MiB, under gRPC's own limit
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := sendRaw(ctx, conn, msg)
				attackBytes.Add(int64(len(msg)))
				if status.Code(err) != codes.InvalidArgument {
					fail("a message of %d bytes of empty writes: %v, want INVALID_ARGUMENT", len(msg), err)
					return
				}
				refused.Add(1)
			}
		}()
	}
	// The legitimate client.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := files.Write(ctx, &filewritev1.WriteRequest{Path: fmt.Sprintf("legit/%d.bin", i%16), Data: legit}); err != nil {
				fail("a legitimate Write during the attacks: %v", err)
				return
			}
			legitWrites.Add(1)
			resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				fail("health during the attacks: %v, %v", resp, err)
				return
			}
		}
	}()
	time.Sleep(length)
	close(stop)
	wg.Wait()

	hwm, err := procStatusKB(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	cpu -= baseCPU
	grown := (hwm - baseRSS) << 10
	// At once in flight: one message of each attack stream, and one
	// legitimate Write.
	inFlight := int64(len(emptyWrites("records.bin", maxRequest, false)) + len(emptyWrites("quadratic.bin", 100_000, true)) + len(legit))
	t.Logf("%v: %d legitimate writes, %d attack messages refused (%d MiB); peak memory +%d MiB, CPU %v",
		length, legitWrites.Load(), refused.Load(), attackBytes.Load()>>20, grown>>20, cpu)
	if legitWrites.Load() == 0 {
		t.Error("no legitimate write went through")
	}
	if bound := attackBytesFactor*inFlight + attackAllowance; grown > bound {
		t.Errorf("peak memory grew by %d MiB, over %dx the %d MiB in flight plus %d MiB", grown>>20, attackBytesFactor, inFlight>>20, attackAllowance>>20)
	}
	if bound := time.Second + time.Duration(attackBytes.Load()>>20)*attackCPUPerMiB + time.Duration(legitWrites.Load())*legitCPUPerWrite; cpu > bound {
		t.Errorf("the daemon used %v of CPU, over the bound of %v", cpu, bound)
	}
}

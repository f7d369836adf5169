package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// sentPastWindow is a dialer whose connections close sent once more than
// threshold bytes went out on them. Past the server's connection window
// (16 MiB), the client can only have sent that much because the server
// read the call's frames and gave window back: the server has the call,
// and a graceful stop must let it finish. A client-side event such as
// OutHeader says less: the headers may still sit unread in a socket when
// SIGTERM arrives, and then the call is refused, rightly, as never begun.
type sentPastWindow struct {
	threshold int64
	once      sync.Once
	sent      chan struct{}
}

func (d *sentPastWindow) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, d: d}, nil
}

type countingConn struct {
	net.Conn
	d *sentPastWindow
	n atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.n.Add(int64(n)) > c.d.threshold {
		c.d.once.Do(func() { close(c.d.sent) })
	}
	return n, err
}

// TestDaemonDrainsOnSIGTERM runs the real binary: it starts on port 0,
// answers health, and on SIGTERM turns NOT_SERVING, lets a long gRPC Write
// and a REST PUT that is still receiving its body finish, syncs, and exits 0.
func TestDaemonDrainsOnSIGTERM(t *testing.T) {
	ctx, root, proc, logs := startFresh(t, 3*time.Minute, "--drain-timeout", "2m")
	grpcAddr, httpAddr := proc.GRPCAddr, proc.HTTPAddr

	conn := testutil.PlaintextConn(t, grpcAddr)
	health := healthpb.NewHealthClient(conn)
	if resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before SIGTERM: %v, %v; want SERVING\n%s", resp.GetStatus(), err, logs)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch := testutil.WatchHealth(t, watchCtx, conn)
	watch(healthpb.HealthCheckResponse_SERVING)

	// A 64 MiB Write with SYNC_MODE_FULL, on a connection of its own.
	signal := &sentPastWindow{threshold: 32 << 20, sent: make(chan struct{})}
	writeConn, err := grpc.NewClient("passthrough:///"+grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(signal.dial))
	if err != nil {
		t.Fatal(err)
	}
	defer writeConn.Close()
	big := allBytes(64 << 20)
	grpcDone := make(chan error, 1)
	go func() {
		resp, err := filewritev1.NewFileServiceClient(writeConn).Write(ctx,
			&filewritev1.WriteRequest{Path: "big.bin", Data: big, Sync: filewritev1.SyncMode_SYNC_MODE_FULL})
		if err == nil && resp.GetBytesWritten() != int64(len(big)) {
			err = errors.New("short write: " + resp.String())
		}
		grpcDone <- err
	}()

	// A raw PUT whose body the test holds back.
	body := allBytes(1<<20 + 3)
	put := testutil.StartHeldPut(t, ctx, "http://"+httpAddr+"/v1/files/put.bin?sync=data", body, 2*time.Minute)

	for _, ch := range []chan struct{}{signal.sent, put.Reading} {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("requests never got in flight:\n%s", logs)
		}
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Draining: a health watcher is told NOT_SERVING while the PUT still
	// waits for its body. (A health Check would be refused: the server
	// takes no new call.) The watch then ends, as watchers do when told.
	watch(healthpb.HealthCheckResponse_NOT_SERVING)
	stopWatch()
	put.Send()

	if got := <-put.Done; got.Err != nil || got.Status != http.StatusCreated {
		t.Errorf("PUT during the drain: %d %s %v, want 201 (it creates put.bin)\n%s", got.Status, got.Body, got.Err, logs)
	} else {
		var wr struct{ BytesWritten string }
		if err := json.Unmarshal([]byte(got.Body), &wr); err != nil || wr.BytesWritten != "1048579" {
			t.Errorf("PUT during the drain answered %s, want bytesWritten 1048579", got.Body)
		}
	}
	if err := <-grpcDone; err != nil {
		t.Errorf("64 MiB Write during the drain: %v\n%s", err, logs)
	}
	if err := proc.Wait(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v, want exit status 0\n%s", err, logs)
	}
	if !strings.Contains(logs.String(), "all files synced") {
		t.Errorf("the log does not say the files were synced:\n%s", logs)
	}
	for name, want := range map[string][]byte{"big.bin": big, "put.bin": body} {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s after exit: %d bytes, %v; want the %d bytes written", name, len(got), err, len(want))
		}
	}
}

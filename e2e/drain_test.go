package e2e

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDaemonDrainsUnderLoad sends SIGTERM to the daemon binary while
// gRPC and REST writers keep it busy. Every request either succeeds or is
// refused as unavailable (gRPC UNAVAILABLE; over REST a refused connection
// or 503): nothing fails half way. The daemon exits 0 after syncing its
// files, and every acknowledged write is in the files it leaves.
// TestDaemonDrainsOnSIGTERM shows single long requests in flight finishing;
// this test shows the same under concurrent load.
func TestDaemonDrainsUnderLoad(t *testing.T) {
	ctx, root, proc, logs := startFresh(t, 4*time.Minute, "--drain-timeout", "2m")
	grpcAddr, httpAddr := proc.GRPCAddr, proc.HTTPAddr

	const grpcWriters, httpWriters = 6, 2
	const writers = grpcWriters + httpWriters
	files := []string{"drain/a.bin", "drain/b.bin"}
	var acks ackLog
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range grpcWriters {
		// A connection each, as separate clients would have.
		conn := testutil.PlaintextConn(t, grpcAddr)
		wg.Go(func() {
			errs[w] = grpcLoadWriter(ctx, filewritev1.NewFileServiceClient(conn), &acks, files, writers, w)
		})
	}
	for w := grpcWriters; w < writers; w++ {
		client := &http.Client{Transport: &http.Transport{}}
		wg.Go(func() { errs[w] = httpLoadWriter(ctx, client, "http://"+httpAddr, &acks, files, writers, w) })
	}
	for {
		if acked, _ := acks.counts(); acked >= 200 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the load did not get going:\n%s", logs)
		case <-time.After(time.Millisecond):
		}
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := proc.Wait(); err != nil {
		t.Errorf("daemon exit after SIGTERM under load: %v, want exit status 0\n%s", err, logs)
	}
	for w, err := range errs {
		if !refusedWhileDraining(err) {
			t.Errorf("writer %d stopped with %v, want a refusal as unavailable", w, err)
		}
		t.Logf("writer %d stopped with %v", w, err)
	}
	if !strings.Contains(logs.String(), "all files synced") {
		t.Errorf("the log does not say the files were synced:\n%s", logs)
	}
	acked, _ := acks.counts()
	t.Logf("%d writes acknowledged before the daemon stopped", acked)
	checkSlots(t, "after the drain", acks.acked, func(f string) []byte {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		return b
	})
}

// refusedWhileDraining: gRPC's UNAVAILABLE; over HTTP a 503 or a
// connection refused, reset or closed. A reset or closed connection is the
// keep-alive race every HTTP server has when it closes idle connections: a
// request sent on one as it closes is never read.
func refusedWhileDraining(err error) bool {
	var opErr *net.OpError
	switch {
	case status.Code(err) == codes.Unavailable,
		errors.As(err, &opErr),
		errors.Is(err, io.EOF),
		err != nil && strings.Contains(err.Error(), "server closed idle connection"),
		err != nil && err.Error() == "HTTP 503":
		return true
	}
	return false
}

// TestDaemonShutdownDelay: with FILEWRITE_SHUTDOWN_DELAY set, the daemon
// binary answers SIGTERM by reporting NOT_SERVING (/readyz 503) while it
// still takes new connections and Writes;
// a second SIGTERM then ends it at once, as it ends a drain.
func TestDaemonShutdownDelay(t *testing.T) {
	t.Setenv("FILEWRITE_SHUTDOWN_DELAY", "1h")
	ctx, root, proc, logs := startFresh(t, 2*time.Minute)
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "/readyz to answer 503", func() bool {
		resp, err := http.Get("http://" + proc.HTTPAddr + "/readyz")
		if err != nil {
			t.Fatalf("/readyz during the delay: %v\n%s", err, logs)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	conn := testutil.PlaintextConn(t, proc.GRPCAddr)
	if _, err := filewritev1.NewFileServiceClient(conn).Write(ctx, &filewritev1.WriteRequest{Path: "late.bin", Data: []byte("late")}); err != nil {
		t.Errorf("Write on a new connection during the delay: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "late.bin")); err != nil || string(got) != "late" {
		t.Errorf("late.bin: %q, %v; want \"late\"", got, err)
	}
	proc.Signal(syscall.SIGTERM)
	select {
	case <-proc.Exited():
	case <-ctx.Done():
		t.Fatalf("a second SIGTERM during the delay did not end the daemon:\n%s", logs)
	}
}

package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
	dir := testutil.Dir(t)
	bin := testutil.BuildDaemon(t, dir, raceEnabled)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	root := filepath.Join(dir, "root")
	proc, logs := testutil.StartDaemon(t, ctx, bin, "--root", root, "--drain-timeout", "2m")
	grpcAddr, httpAddr := proc.GRPCAddr, proc.HTTPAddr

	const grpcWriters, httpWriters = 6, 2
	const writers = grpcWriters + httpWriters
	files := []string{"drain/a.bin", "drain/b.bin"}
	var acks ackLog
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range grpcWriters {
		// A connection each, as separate clients would have.
		conn := plaintextConn(t, grpcAddr)
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

// TestShutdownRefusesNewCallsWhileRESTDrains: once Shutdown begins, the
// gRPC listener takes no new call (UNAVAILABLE, on a connection that was
// open as on a new one) even though a REST PUT is still receiving its
// body; that PUT then finishes through the gateway's own gRPC connection,
// and Shutdown returns once it has.
func TestShutdownRefusesNewCallsWhileRESTDrains(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "before.bin", Data: []byte("before")}); err != nil {
		t.Fatalf("write before the shutdown: %v", err)
	}

	// A raw PUT whose body the test holds back until the shutdown began.
	body := allBytes(3<<20 + 5)
	put := startHeldPut(t, ctx, d.url+"/v1/files/put.bin?sync=data", body, time.Minute)
	select {
	case <-put.reading:
	case <-ctx.Done():
		t.Fatal("the PUT never reached its handler")
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	watch := watchHealth(t, watchCtx, d.conn)
	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- d.srv.Shutdown() }()
	// A health watcher is told NOT_SERVING, and the client's connection
	// is told to start no new call (GOAWAY): it leaves READY.
	watch(healthpb.HealthCheckResponse_NOT_SERVING)
	stopWatch()
	for d.conn.GetState() == connectivity.Ready {
		if !d.conn.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatal("the client's connection stayed READY: the server never said to start no new call")
		}
	}

	_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "after.bin", Data: []byte("after")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC Write on an open connection after Shutdown began: %v, want UNAVAILABLE", err)
	}
	fresh := plaintextConn(t, d.srv.GRPCAddr().String())
	_, err = filewritev1.NewFileServiceClient(fresh).Write(ctx, &filewritev1.WriteRequest{Path: "after.bin", Data: []byte("after")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC Write on a new connection after Shutdown began: %v, want UNAVAILABLE", err)
	}
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned (%v) with a PUT still in flight", err)
	default:
	}

	put.send()
	if got := <-put.done; got.err != nil || got.status != http.StatusOK {
		t.Errorf("PUT in flight during the drain: %d %s %v, want 200 OK", got.status, got.body, got.err)
	}
	if err := <-shutdownDone; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := d.onDisk(t, "put.bin"); !bytes.Equal(got, body) {
		t.Errorf("put.bin after the drain: %d bytes, want the %d bytes sent", len(got), len(body))
	}
	if _, err := os.Stat(filepath.Join(d.root, "after.bin")); !os.IsNotExist(err) {
		t.Errorf("after.bin exists (%v): a refused Write was performed", err)
	}
}

// heldPut is a raw PUT whose body the test holds back: reading is closed
// once the daemon's handler has begun to read the body ("Expect:
// 100-continue" says when), send lets the body go, and done gives the
// answer.
type heldPut struct {
	reading chan struct{}
	done    chan putResult
	body    []byte
	pw      *io.PipeWriter
}

type putResult struct {
	status int
	body   string
	err    error
}

// startHeldPut sends a PUT of body to url, a file's raw PUT, without its
// body; the client waits up to wait for the handler to ask for it.
func startHeldPut(t *testing.T, ctx context.Context, url string, body []byte, wait time.Duration) *heldPut {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, "PUT", url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", mimeOctetStream)
	req.Header.Set("Expect", "100-continue")
	p := &heldPut{reading: make(chan struct{}), done: make(chan putResult, 1), body: body, pw: pw}
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{Got100Continue: func() { close(p.reading) }}))
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: wait}}
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			p.done <- putResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		p.done <- putResult{resp.StatusCode, string(b), err}
	}()
	return p
}

// send lets the body go.
func (p *heldPut) send() {
	go func() {
		p.pw.Write(p.body)
		p.pw.Close()
	}()
}

// watchHealth opens a health Watch on conn and returns a function that
// waits until the watch reports want.
func watchHealth(t *testing.T, ctx context.Context, conn *grpc.ClientConn) func(want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health Watch: %v", err)
	}
	return func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("health Watch, waiting for %v: %v", want, err)
			}
			if resp.GetStatus() == want {
				return
			}
		}
	}
}

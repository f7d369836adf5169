package service

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

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
	body := testutil.AllBytes(3<<20 + 5)
	put := testutil.StartHeldPut(t, ctx, d.url+"/v1/files/put.bin?sync=data", body, time.Minute)
	select {
	case <-put.Reading:
	case <-ctx.Done():
		t.Fatal("the PUT never reached its handler")
	}

	// A health watcher is told NOT_SERVING, and the client's connection
	// is told to start no new call (GOAWAY): it leaves READY.
	shutdownDone := beginShutdown(t, ctx, d)
	for d.conn.GetState() == connectivity.Ready {
		if !d.conn.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatal("the client's connection stayed READY: the server never said to start no new call")
		}
	}

	_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "after.bin", Data: []byte("after")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC Write on an open connection after Shutdown began: %v, want UNAVAILABLE", err)
	}
	fresh := testutil.PlaintextConn(t, d.srv.GRPCAddr().String())
	_, err = filewritev1.NewFileServiceClient(fresh).Write(ctx, &filewritev1.WriteRequest{Path: "after.bin", Data: []byte("after")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC Write on a new connection after Shutdown began: %v, want UNAVAILABLE", err)
	}
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned (%v) with a PUT still in flight", err)
	default:
	}

	put.Send()
	if got := <-put.Done; got.Err != nil || got.Status != http.StatusCreated {
		t.Errorf("PUT in flight during the drain: %d %s %v, want 201 Created", got.Status, got.Body, got.Err)
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

// beginShutdown starts d's Shutdown and returns, with the channel that
// Shutdown's result comes on, once a health watcher was told NOT_SERVING.
func beginShutdown(t *testing.T, ctx context.Context, d *daemon) <-chan error {
	t.Helper()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch := testutil.WatchHealth(t, watchCtx, d.conn)
	done := make(chan error, 1)
	go func() { done <- d.srv.Shutdown() }()
	watch(healthpb.HealthCheckResponse_NOT_SERVING)
	return done
}

// TestShutdownDelayServesOn: during --shutdown-delay health says
// NOT_SERVING and /readyz 503, while every listener still serves: a Write
// on an open connection and on a new one, a REST PUT, a WebDAV PUT and a
// tus creation, a write on a new NBD connection, and a WriteStream opened before, which reads on. Once
// the delay ends the drain runs as without one: the stream acks what it
// read and ends with UNAVAILABLE, and Shutdown returns.
func TestShutdownDelayServesOn(t *testing.T) {
	sock := nbdSocket(t)
	d := startDaemon(t, func(c *Config) {
		c.ShutdownDelay = time.Hour
		c.NBDAddr = "unix:" + sock
	})
	ctx := testContext(t)
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "nbd.bin", Data: make([]byte, 4096)}); err != nil {
		t.Fatal(err)
	}
	stream := openStream(t, ctx, d.client, "stream.bin")
	send := func(id uint64, data string) {
		t.Helper()
		w := streamWriteOf(id, int64(id)*4, []byte(data), filewritev1.SyncMode_SYNC_MODE_UNSPECIFIED)
		if err := stream.Send(&filewritev1.WriteStreamRequest{Writes: []*filewritev1.StreamWrite{w}}); err != nil {
			t.Fatalf("send write %d: %v", id, err)
		}
		resp, err := stream.Recv()
		if err != nil || len(resp.GetAcks()) != 1 || resp.GetAcks()[0].GetStatus() != nil {
			t.Fatalf("ack of write %d: %v %v, want one OK ack", id, resp, err)
		}
	}
	send(0, "aaaa")

	shutdownDone := beginShutdown(t, ctx, d)

	if got := testutil.DoHTTP(t, http.MethodGet, d.url+"/readyz", nil, nil); got.Status != http.StatusServiceUnavailable || !strings.Contains(string(got.Body), "NOT_SERVING") {
		t.Errorf("/readyz during the delay: %d %s, want 503 NOT_SERVING", got.Status, got.Body)
	}
	if got := testutil.DoHTTP(t, http.MethodGet, d.url+"/healthz", nil, nil); got.Status != http.StatusOK {
		t.Errorf("/healthz during the delay: %d %s, want 200", got.Status, got.Body)
	}
	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "open.bin", Data: []byte("open")}); err != nil {
		t.Errorf("Write on an open connection during the delay: %v", err)
	}
	fresh := testutil.PlaintextConn(t, d.srv.GRPCAddr().String())
	if _, err := filewritev1.NewFileServiceClient(fresh).Write(ctx, &filewritev1.WriteRequest{Path: "fresh.bin", Data: []byte("fresh")}); err != nil {
		t.Errorf("Write on a new connection during the delay: %v", err)
	}
	if got := testutil.DoHTTP(t, http.MethodPut, d.url+"/v1/files/put.bin", strings.NewReader("put"), nil); got.Status != http.StatusCreated {
		t.Errorf("PUT during the delay: %d %s, want 201", got.Status, got.Body)
	}
	// The doors beside the gateway share its listener, and serve on too.
	if got := testutil.DoHTTP(t, http.MethodPut, d.url+"/dav/dav.bin", strings.NewReader("dav"), nil); got.Status != http.StatusCreated {
		t.Errorf("WebDAV PUT during the delay: %d %s, want 201", got.Status, got.Body)
	}
	if got := testutil.DoHTTP(t, http.MethodPost, d.url+"/v1/uploads/", nil, map[string]string{
		"Tus-Resumable": "1.0.0", "Upload-Length": "3", "Upload-Metadata": "filename dHVzLmJpbg=="}); got.Status != http.StatusCreated {
		t.Errorf("tus creation during the delay: %d %s, want 201", got.Status, got.Body)
	}
	nc := dialNBD(t, sock, "nbd.bin")
	nc.send(t, nbdWrite, 7, 0, 4, []byte("nbdw"))
	if cookie, errno := nc.reply(t); cookie != 7 || errno != 0 {
		t.Errorf("NBD write on a new connection during the delay: cookie %d error %d, want 7, success", cookie, errno)
	}
	send(1, "bbbb")
	select {
	case err := <-shutdownDone:
		t.Fatalf("Shutdown returned (%v) during the delay", err)
	default:
	}

	close(d.srv.endDelay)
	e := recvAll(stream)
	if status.Code(e.err) != codes.Unavailable || len(e.acks) != 0 {
		t.Errorf("the stream after the delay: %d more acks, end %v; want none and UNAVAILABLE", len(e.acks), e.err)
	}
	if err := <-shutdownDone; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := d.onDisk(t, "nbd.bin"); string(got[:4]) != "nbdw" {
		t.Errorf("nbd.bin after the shutdown starts %q, want \"nbdw\"", got[:4])
	}
	for name, want := range map[string]string{"stream.bin": "aaaabbbb", "open.bin": "open", "fresh.bin": "fresh", "put.bin": "put", "dav.bin": "dav"} {
		if got := d.onDisk(t, name); string(got) != want {
			t.Errorf("%s after the shutdown: %q, want %q", name, got, want)
		}
	}
}

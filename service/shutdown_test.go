package service

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
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

	watchCtx, stopWatch := context.WithCancel(ctx)
	watch := testutil.WatchHealth(t, watchCtx, d.conn)
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

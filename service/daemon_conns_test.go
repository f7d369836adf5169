package service

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// TestDaemonClosesUnauthenticatedConnections runs the binary with 128
// file descriptors and opens 280 connections that never authenticate:
// gRPC ones that send the HTTP/2 preface (with or without their settings)
// and nothing more, and REST ones whose request is refused with 401 and
// whose body then stalls. They exhaust the descriptors, but each is closed
// once it has gone --conn-auth-timeout without an authenticated request,
// so the descriptors come back and a client with a token gets its Write
// through.
func TestDaemonClosesUnauthenticatedConnections(t *testing.T) {
	dir := testDir(t)
	bin := buildDaemon(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	tokens := writeTokenFile(t, dir, "tokens", tokenAlpha)
	cmd, grpcAddr, httpAddr, logs := startDaemonProcess(t, ctx, bin, "--root", filepath.Join(dir, "root"),
		"--auth-token-file", tokens, "--conn-auth-timeout", "2s")
	var old unix.Rlimit
	if err := unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 128, Max: 128}, &old); err != nil {
		t.Skipf("cannot lower the daemon's RLIMIT_NOFILE: %v", err)
	}

	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	emptySettings := string([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // length 0, type SETTINGS, stream 0
	stalledPut := "PUT /v1/files/stalled HTTP/1.1\r\nHost: filewrite\r\nContent-Type: application/octet-stream\r\n" +
		"Content-Length: 100\r\n\r\nx"
	kinds := []struct {
		name, addr, send string
		n                int
	}{
		{"gRPC, preface only", grpcAddr, preface, 70},
		{"gRPC, preface and settings", grpcAddr, preface + emptySettings, 70},
		{"REST, refused, body stalled", httpAddr, stalledPut, 140},
	}
	type stranger struct {
		kind string
		conn net.Conn
	}
	var strangers []stranger
	for _, k := range kinds {
		for range k.n {
			c, err := net.Dial("tcp", k.addr)
			if err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, k.send); err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			strangers = append(strangers, stranger{k.name, c})
		}
	}

	// A client with a token, whose connection waits in the accept queue
	// behind the strangers'.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := filewritev1.NewFileServiceClient(conn)
	write := func() error {
		wctx, wcancel := context.WithTimeout(withAuth(ctx, "Bearer "+tokenAlpha), time.Minute)
		defer wcancel()
		_, err := c.Write(wctx, &filewritev1.WriteRequest{Path: "legit.bin", Data: []byte("legit")}, grpc.WaitForReady(true))
		return err
	}
	legit := make(chan error, 1)
	go func() { legit <- write() }()

	// Every stranger is shown the door by the daemon: each read ends with
	// the connection closed, not with the test's own deadline.
	for i, s := range strangers {
		s.conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.Copy(io.Discard, s.conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s connection %d: still open after a minute\n%s", s.kind, i, logs)
		}
	}
	t.Logf("%d strangers' connections closed", len(strangers))

	// While strangers held the descriptors, the Write may have found none
	// left to open its file with; with them gone, it goes through.
	if err := <-legit; err != nil {
		if !strings.Contains(err.Error(), "too many open files") {
			t.Fatalf("a Write with a token among %d strangers' connections: %v\n%s", len(strangers), err, logs)
		}
		t.Logf("the Write failed while strangers held every descriptor (%v); again now", err)
		if err := write(); err != nil {
			t.Fatalf("a Write with a token once the strangers were gone: %v", err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "root", "legit.bin")); err != nil || string(got) != "legit" {
		t.Errorf("legit.bin: %q, %v", got, err)
	}
}

//go:build linux

package nbd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/store"
)

// TestMain fails the package when its tests leave goroutines running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// testServer is a Server over a store of a fresh directory, listening on
// a unix socket.
type testServer struct {
	root string
	st   *store.Store
	srv  *Server
	sock string
	// served ends with Serve's error.
	served chan error
	// crashed: the store's file system was frozen by a power cut, and
	// closing the store fails.
	crashed bool
}

// startServer starts a server with the StoreBackend over a store of a
// fresh directory; with changes cfg before the server is made. It is
// shut down when the test ends.
func startServer(t *testing.T, with ...func(*Config, *StoreBackend)) *testServer {
	t.Helper()
	root := testutil.Dir(t)
	fsys, err := store.OpenOSFS(root)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(fsys, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return serveStore(t, root, st, with...)
}

// serveStore serves st (over root) as startServer does, and closes it
// when the test ends.
func serveStore(t *testing.T, root string, st *store.Store, with ...func(*Config, *StoreBackend)) *testServer {
	t.Helper()
	b := &StoreBackend{Store: st}
	cfg := Config{Backend: b}
	for _, w := range with {
		w(&cfg, b)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A unix socket's path must fit in 108 bytes: not under the package.
	sockDir, err := os.MkdirTemp("", "nbd-test-")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{root: root, st: st, srv: srv, sock: filepath.Join(sockDir, "s"), served: make(chan error, 1)}
	l, err := net.Listen("unix", ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { ts.served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-ts.served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
		os.RemoveAll(sockDir)
		if err := st.Close(); err != nil && !ts.crashed {
			t.Errorf("store Close: %v", err)
		}
	})
	return ts
}

// uri is the NBD URI of the export name on ts's socket.
func (ts *testServer) uri(name string) string {
	return "nbd+unix:///" + name + "?socket=" + ts.sock
}

// file writes data to the file name under the root, outside the store,
// as an image made before the daemon started.
func (ts *testServer) file(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(ts.root, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// testPKI is a server certificate, a CA of client certificates, and the
// server's TLS configuration, which requires a certificate of that CA.
type testPKI struct {
	server testutil.Cert
	ca     *testutil.CA
	conf   *tls.Config
}

func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	pki := testPKI{server: testutil.NewCert(t, dir, "server"), ca: testutil.NewCA(t, dir)}
	pair, err := tls.LoadX509KeyPair(pki.server.CertFile, pki.server.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(pki.ca.File)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(caPEM)
	pki.conf = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	return pki
}

// certURI is the first URI of the client certificate p presented, "" for
// none.
func certURI(p *Peer) string {
	if p.TLS == nil || len(p.TLS.PeerCertificates) == 0 || len(p.TLS.PeerCertificates[0].URIs) == 0 {
		return ""
	}
	return p.TLS.PeerCertificates[0].URIs[0].String()
}

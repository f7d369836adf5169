package service

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestPprof: --pprof-addr serves net/http/pprof on its own listener, with
// a token when tokens are on; beyond loopback it is refused without
// --insecure-listen.
func TestPprof(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	const token = "a-token-for-the-pprof-test"
	if err := os.WriteFile(tokens, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *Config) {
		c.PprofAddr = "127.0.0.1:0"
		c.AuthTokenFile = tokens
	})
	url := "http://" + d.srv.pprofLis.Addr().String() + "/debug/pprof/cmdline"
	if r := testutil.DoHTTP(t, http.MethodGet, url, nil, nil); r.Status != http.StatusUnauthorized {
		t.Errorf("pprof without a token: %d, want 401", r.Status)
	}
	if r := testutil.DoHTTP(t, http.MethodGet, url, nil, map[string]string{"Authorization": "Bearer " + token}); r.Status != http.StatusOK {
		t.Errorf("pprof with a token: %d %s, want 200", r.Status, r.Body)
	}
	if r := testutil.DoHTTP(t, http.MethodGet, d.url+"/debug/pprof/cmdline", nil, map[string]string{"Authorization": "Bearer " + token}); r.Status == http.StatusOK {
		t.Errorf("pprof on the REST address: 200, want it only on --pprof-addr")
	}

	cfg := DefaultConfig()
	cfg.Root = filepath.Join(testutil.Dir(t), "root2")
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", ""
	cfg.PprofAddr = "0.0.0.0:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	if srv, err := Start(cfg); err == nil || !strings.Contains(err.Error(), "--pprof-addr") {
		if err == nil {
			srv.Shutdown()
		}
		t.Errorf("Start with --pprof-addr 0.0.0.0:0 and no --insecure-listen: %v, want a refusal naming --pprof-addr", err)
	}
}

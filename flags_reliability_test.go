package main

import (
	"io"
	"testing"

	"github.com/filewrite/filewrite/service"
)

func TestParseReliabilityFlags(t *testing.T) {
	cfg, err := parseFlags([]string{
		"--auth-token-file", "/etc/filewrite/tokens", "--tls-cert", "c.pem", "--tls-key", "k.pem",
		"--insecure-listen", "--max-open-files", "77", "--max-waiters-per-file", "5",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{cfg.AuthTokenFile, cfg.TLSCert, cfg.TLSKey, cfg.InsecureListen, cfg.Store.MaxOpenFiles, cfg.Store.MaxWaitersPerFile}
	want := []any{"/etc/filewrite/tokens", "c.pem", "k.pem", true, 77, 5}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("flag %d parsed as %v, want %v", i, got[i], want[i])
		}
	}

	def, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	gotDef := []any{def.AuthTokenFile, def.TLSCert, def.InsecureListen, def.Store.MaxOpenFiles, def.Store.MaxWaitersPerFile}
	wantDef := []any{"", "", false, service.DefaultMaxOpenFiles, service.DefaultMaxWaitersPerFile}
	for i := range gotDef {
		if gotDef[i] != wantDef[i] {
			t.Errorf("default %d = %v, want %v", i, gotDef[i], wantDef[i])
		}
	}
	for _, args := range [][]string{{"--max-open-files", "many"}, {"--max-waiters-per-file", "-"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded, want an error", args)
		}
	}
}

package main

import (
	"errors"
	"flag"
	"io"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/daemonproc"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service"
	"github.com/filewrite/filewrite/store"
)

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := service.DefaultConfig()
	if cfg.Root != "./data" || cfg.GRPCAddr != "127.0.0.1:50051" || cfg.HTTPAddr != "127.0.0.1:8080" {
		t.Errorf("addresses and root = %q %q %q, want ./data 127.0.0.1:50051 127.0.0.1:8080", cfg.Root, cfg.GRPCAddr, cfg.HTTPAddr)
	}
	if cfg.Store != want.Store || cfg.DrainTimeout != want.DrainTimeout {
		t.Errorf("defaults = %+v, want %+v", cfg, want)
	}
	// The limits default to the store's own defaults, or its derivation
	// from the descriptor limit: one source for each.
	gotLimits := []int64{cfg.Store.MaxFileSize, cfg.Store.MaxRequestBytes, int64(cfg.Store.MaxOpenFiles)}
	wantLimits := []int64{store.DefaultMaxFileSize, store.DefaultMaxRequestBytes, int64(store.MaxOpenFilesFor(store.NoFileLimit(), store.IOBuffered))}
	if !slices.Equal(gotLimits, wantLimits) {
		t.Errorf("default file size, request and open-file limits = %v, want the store's %v", gotLimits, wantLimits)
	}
	if cfg.Store.Policy != store.DefaultPolicy {
		t.Errorf("default policy = %v, want store.DefaultPolicy (%v)", cfg.Store.Policy, store.DefaultPolicy)
	}
	if cfg.Logger == nil {
		t.Error("no logger")
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{
		"--root", "/srv/files", "--grpc-addr", ":0", "--http-addr", "",
		"--policy", "shared-overwrite", "--io", "direct", "--fsync", "per-call",
		"--max-file-size", "2TiB", "--max-request-bytes", "4096",
		"--drain-timeout", "5s", "--shutdown-delay", "15s", "--log-level", "debug", "--log-format", "json",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{cfg.Root, cfg.GRPCAddr, cfg.HTTPAddr, cfg.Store.Policy, cfg.Store.IO, cfg.Store.Fsync,
		cfg.Store.MaxFileSize, cfg.Store.MaxRequestBytes, cfg.DrainTimeout, cfg.ShutdownDelay}
	want := []any{"/srv/files", ":0", "", store.PolicySharedOverwrite, store.IODirect, store.FsyncPerCall,
		int64(2 << 40), int64(4096), 5 * time.Second, 15 * time.Second}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("flag %d parsed as %v, want %v", i, got[i], want[i])
		}
	}
}

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
	wantDef := []any{"", "", false, store.MaxOpenFilesFor(store.NoFileLimit(), store.IOBuffered), service.DefaultMaxWaitersPerFile}
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

// TestMaxOpenFilesDefault: without --max-open-files the bound comes from
// RLIMIT_NOFILE, for the --io mode given; with it, it is what was given.
func TestMaxOpenFilesDefault(t *testing.T) {
	nofile := store.NoFileLimit()
	for _, tt := range []struct {
		args []string
		want int
	}{
		{nil, store.MaxOpenFilesFor(nofile, store.IOBuffered)},
		{[]string{"--io", "direct"}, store.MaxOpenFilesFor(nofile, store.IODirect)},
		{[]string{"--io", "direct", "--max-open-files", "100"}, 100},
		{[]string{"--max-open-files", "100", "--io", "direct"}, 100},
	} {
		cfg, err := parseFlags(tt.args, io.Discard)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tt.args, err)
		}
		if got := cfg.Store.MaxOpenFiles; got != tt.want {
			t.Errorf("parseFlags(%q): max open files %d, want %d", tt.args, got, tt.want)
		}
	}
}

// TestSizeOrOffFlags: --extent-cache-size and --map-file-size take a
// size, and 0 turns the feature off (a negative value in store.Options,
// whose zero means the default).
func TestSizeOrOffFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		get  func(*service.Config) int64
		want int64
	}{
		{nil, extentCacheBytes, store.DefaultExtentCacheBytes},
		{[]string{"--extent-cache-size", "64m"}, extentCacheBytes, 64 << 20},
		{[]string{"--extent-cache-size", "0"}, extentCacheBytes, -1},
		{nil, mapFileBytes, store.DefaultMapFileBytes},
		{[]string{"--map-file-size", "64m"}, mapFileBytes, 64 << 20},
		{[]string{"--map-file-size", "0"}, mapFileBytes, -1},
	} {
		cfg, err := parseFlags(tt.args, io.Discard)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tt.args, err)
		}
		if got := tt.get(&cfg); got != tt.want {
			t.Errorf("parseFlags(%q): %d, want %d", tt.args, got, tt.want)
		}
	}
}

func extentCacheBytes(c *service.Config) int64 { return c.Store.ExtentCacheBytes }
func mapFileBytes(c *service.Config) int64     { return c.Store.MapFileBytes }

func TestParseFlagsRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--policy", "fastest"},
		{"--io", "mmap"},
		{"--fsync", "never"},
		{"--max-file-size", "-1"},
		{"--max-file-size", "1PiB"},
		{"--max-request-bytes", "64MB"},
		{"--max-file-size", "9000000TiB"},
		{"--extent-cache-size", "-1"},
		{"--log-level", "chatty"},
		{"--log-format", "xml"},
		{"--no-such-flag"},
		{"positional"},
	} {
		var out strings.Builder
		if _, err := parseFlags(args, &out); err == nil {
			t.Errorf("parseFlags(%q) succeeded, want an error", args)
		}
	}
	if _, err := parseFlags([]string{"-help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-help: %v, want flag.ErrHelp", err)
	}
}

// TestParseFlagsSizeSpellings: a size flag reads both spellings of a unit,
// each a power of 1024, and refuses decimal-looking ones.
func TestParseFlagsSizeSpellings(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{{"64m", 64 << 20}, {"64M", 64 << 20}, {"64MiB", 64 << 20}, {"4k", 4096}, {"4KiB", 4096}, {"1t", 1 << 40}} {
		cfg, err := parseFlags([]string{"--max-file-size", tt.in}, io.Discard)
		if err != nil || cfg.Store.MaxFileSize != tt.want {
			t.Errorf("--max-file-size %s: %d, %v; want %d", tt.in, cfg.Store.MaxFileSize, err, tt.want)
		}
	}
	if _, err := parseFlags([]string{"--max-file-size", "1TB"}, io.Discard); err == nil {
		t.Error("--max-file-size 1TB succeeded, want an error: TB may mean 10^12")
	}
}

// TestLimitFlagsRefuseZero: a limit of 0 is refused with an error that
// names the flag, rather than silently becoming the default.
// --max-waiters-per-file is the exception: its 0 is documented as
// "unbounded".
func TestLimitFlagsRefuseZero(t *testing.T) {
	for _, tt := range []struct {
		args []string
		flag string
	}{
		{[]string{"--max-file-size", "0"}, "max-file-size"},
		{[]string{"--max-file-size", "0KiB"}, "max-file-size"},
		{[]string{"--max-request-bytes", "0"}, "max-request-bytes"},
		{[]string{"--max-open-files", "0"}, "max-open-files"},
		{[]string{"--max-open-files", "-3"}, "max-open-files"},
		{[]string{"--max-waiters-per-file", "-1"}, "max-waiters-per-file"},
	} {
		_, err := parseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %s", tt.args, err, tt.flag)
		}
	}
	cfg, err := parseFlags([]string{"--max-waiters-per-file", "0", "--max-file-size", "1", "--max-open-files", "1"}, io.Discard)
	if err != nil {
		t.Fatalf("parseFlags with the smallest limits: %v", err)
	}
	if got := []any{cfg.Store.MaxWaitersPerFile, cfg.Store.MaxFileSize, cfg.Store.MaxOpenFiles}; got[0] != 0 || got[1] != int64(1) || got[2] != 1 {
		t.Errorf("smallest limits parsed as %v, want [0 1 1]", got)
	}
}

// TestConfigErrorsNameFlags: a setting that service.Config.Validate
// refuses is named by its flag, whose value the message repeats.
func TestConfigErrorsNameFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--stream-idle-timeout", "0s"}, "--stream-idle-timeout is 0s: want more than 0"},
		{[]string{"--drain-timeout", "-1s"}, "--drain-timeout is -1s: want 0 or more"},
		{[]string{"--shutdown-delay", "-1s"}, "--shutdown-delay is -1s: want 0 or more"},
		{[]string{"--max-request-bytes", "2g"}, "--max-request-bytes is 2147483648: want at most 1073741824"},
		{[]string{"--max-inflight-bytes", "1k"}, "--max-inflight-bytes is 1024: want at least"},
		{[]string{"--max-open-files", strconv.FormatUint(store.NoFileLimit(), 10)}, "RLIMIT_NOFILE"},
		{[]string{"--root", ""}, "--root is empty"},
	} {
		_, err := parseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%q) = %v, want an error with %q", tt.args, err, tt.want)
		}
	}
}

// TestFlagOfNamesFlags: each field flagOf names is a field of
// service.Config, and its flag is one registerFlags registers.
func TestFlagOfNamesFlags(t *testing.T) {
	var cfg service.Config
	fs := flag.NewFlagSet("filewrite", flag.ContinueOnError)
	registerFlags(fs, &cfg)
	for field, name := range flagOf {
		typ, fieldName := reflect.TypeFor[service.Config](), field
		if f, ok := strings.CutPrefix(field, "Store."); ok {
			typ, fieldName = reflect.TypeFor[store.Options](), f
		}
		if _, ok := typ.FieldByName(fieldName); !ok {
			t.Errorf("flagOf names %s, not a field of %v", field, typ)
		}
		if fs.Lookup(name) == nil {
			t.Errorf("flagOf gives %s the flag --%s, which is not registered", field, name)
		}
	}
}

// TestListeningLines: the daemon's listening records, in either log
// format, parse with the one parser that whoever starts it on port 0 uses
// (daemonproc.ParseListening), and name the addresses it listens on: both
// TCP listeners, or a unix socket whose path needs quoting.
func TestListeningLines(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "a socket")
	for _, format := range []string{"text", "json"} {
		for _, tt := range []struct {
			name string
			args []string
			want func(*service.Server) []daemonproc.Listener
		}{
			{"tcp", []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"},
				func(srv *service.Server) []daemonproc.Listener {
					return []daemonproc.Listener{
						{Protocol: "grpc", Addr: srv.GRPCAddr().String()},
						{Protocol: "http", Addr: srv.HTTPAddr().String()},
					}
				}},
			{"unix", []string{"--grpc-addr", "unix:" + sock, "--http-addr", ""},
				func(*service.Server) []daemonproc.Listener {
					return []daemonproc.Listener{{Protocol: "grpc", Addr: sock}}
				}},
		} {
			t.Run(format+"/"+tt.name, func(t *testing.T) {
				var log testutil.LockedBuffer
				args := append([]string{"--root", filepath.Join(testutil.Dir(t), "root"), "--log-format", format}, tt.args...)
				cfg, err := parseFlags(args, &log)
				if err != nil {
					t.Fatal(err)
				}
				srv, err := service.Start(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Shutdown()
				var got []daemonproc.Listener
				for line := range strings.Lines(log.String()) {
					if l, ok := daemonproc.ParseListening(strings.TrimSuffix(line, "\n")); ok {
						got = append(got, l)
					}
				}
				if want := tt.want(srv); !slices.Equal(got, want) {
					t.Errorf("listening records %+v, want %+v; the log:\n%s", got, want, log.String())
				}
			})
		}
	}
}

// TestLogDurationsAsStrings: a duration is logged as a Go duration string
// in both formats; slog's JSON handler alone writes integer nanoseconds.
func TestLogDurationsAsStrings(t *testing.T) {
	for _, tt := range []struct{ format, want string }{
		{"json", `"timeout":"30s"`},
		{"text", "timeout=30s"},
	} {
		var out strings.Builder
		log, err := (&logFlags{level: "info", format: tt.format}).logger(&out)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("draining", "timeout", 30*time.Second)
		if !strings.Contains(out.String(), tt.want) {
			t.Errorf("%s log %q lacks %s", tt.format, out.String(), tt.want)
		}
	}
}

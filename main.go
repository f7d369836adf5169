// Command filewrite is the daemon: it serves positional writes into the
// files below --root over gRPC and, through a gateway, over REST. It is
// configured by flags, each of which an environment variable can set too
// (env.go; docs/operations.md); everything else happens in package service.
//
// To add a flag, register it in registerFlags against a field of
// service.Config and give that field its default in service.DefaultConfig
// (a store option's comes from store.DefaultOptions): its environment
// variable follows from its name. If Config.Validate checks the field,
// name the flag in flagOf, so that a refusal names the flag.
//
// Besides the daemon, the binary answers --version and runs one
// subcommand, "filewrite probe" (probe.go), a health check for containers
// that have no shell.
package main

//go:generate bash scripts/generate.sh

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/filewrite/filewrite/internal/bytesize"
	"github.com/filewrite/filewrite/service"
	"github.com/filewrite/filewrite/store"
)

func main() {
	// SIGHUP must never kill the daemon (see service.Run, which catches it
	// from its start); until then it is ignored.
	signal.Ignore(syscall.SIGHUP)
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(runProbe(os.Args[2:], os.Stdout, os.Stderr))
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errVersion):
		fmt.Println(service.ReadBuildInfo())
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "filewrite:", err)
		os.Exit(2)
	}
	slog.SetDefault(cfg.Logger)
	if err := service.Run(context.Background(), cfg); err != nil {
		cfg.Logger.Error("filewrite failed", "error", err)
		os.Exit(1)
	}
}

// errVersion is returned by parseFlags when --version asks for the version
// instead of a daemon.
var errVersion = errors.New("--version given")

// parseFlags turns the command line and the FILEWRITE_* environment
// variables into a service.Config; a flag on the command line wins over
// its variable. Errors and -help go to out.
func parseFlags(args []string, out io.Writer) (service.Config, error) {
	cfg := service.DefaultConfig()
	fs := flag.NewFlagSet("filewrite", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { usage(fs) }
	logs := registerFlags(fs, &cfg)
	version := fs.Bool("version", false, "print the version, commit and Go version, and exit")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q: filewrite takes flags only (or the subcommand probe, first)", fs.Args())
	}
	if *version {
		return cfg, errVersion
	}
	if err := setFromEnv(fs, os.LookupEnv); err != nil {
		return cfg, err
	}
	deriveDefaults(fs, &cfg)
	if err := validate(cfg); err != nil {
		return cfg, err
	}
	var err error
	if cfg.Logger, err = logs.logger(out); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// validate is cfg.Validate, whose refusals name the flag that sets the
// refused setting rather than its field.
func validate(cfg service.Config) error {
	err := cfg.Validate()
	if ce, ok := errors.AsType[*service.ConfigError](err); ok {
		if name, ok := flagOf[ce.Field]; ok {
			return fmt.Errorf("--%s %s", name, ce.Problem)
		}
	}
	return err
}

// flagOf is the flag that sets each field of service.Config that
// Config.Validate may refuse (service.ConfigError.Field); a field that no
// flag sets keeps its own name in the error.
var flagOf = map[string]string{
	"Root":                    "root",
	"GRPCAddr":                "grpc-addr",
	"Store.Policy":            "policy",
	"Store.IO":                "io",
	"Store.Fsync":             "fsync",
	"Store.SyncedWrites":      "synced-writes",
	"Store.MaxFileSize":       "max-file-size",
	"Store.MaxRequestBytes":   "max-request-bytes",
	"Store.MaxOpenFiles":      "max-open-files",
	"Store.MaxWaitersPerFile": "max-waiters-per-file",
	"MaxStreamBytes":          "max-stream-bytes",
	"StreamIdleTimeout":       "stream-idle-timeout",
	"MaxFilesPerStream":       "max-files-per-stream",
	"ShutdownDelay":           "shutdown-delay",
	"DrainTimeout":            "drain-timeout",
	"ConnAuthTimeout":         "conn-auth-timeout",
	"BodyTimeout":             "body-timeout",
	"UploadExpiry":            "upload-expiry",
	"MaxInflightBytes":        "max-inflight-bytes",
	"TraceURLTemplate":        "trace-url-template",
}

// registerFlags binds every flag to its field of cfg, whose current values
// are the defaults shown by -help.
func registerFlags(fs *flag.FlagSet, cfg *service.Config) *logFlags {
	fs.StringVar(&cfg.Root, "root", cfg.Root, "directory whose files are served; created if missing")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "gRPC listen address: host:port (port 0 picks a free port; the log says which) or unix:PATH")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "REST gateway listen address; empty disables the gateway")
	fs.StringVar(&cfg.PprofAddr, "pprof-addr", cfg.PprofAddr,
		"serve net/http/pprof on this host:port (loopback only, unless --insecure-listen); empty serves none")
	fs.StringVar(&cfg.TraceURLTemplate, "trace-url-template", cfg.TraceURLTemplate,
		"link each trace id on /debug/locks to this `URL`, with {trace_id} (and {span_id}) filled in: http://jaeger:16686/trace/{trace_id}")
	fs.StringVar(&cfg.NBDAddr, "nbd-addr", cfg.NBDAddr,
		"serve the files as NBD exports (docs/nbd.md) on host:port or unix:PATH (a socket of mode 0660); empty serves none")
	fs.Var(enumFlag[store.Policy]{&cfg.Store.Policy, store.ParsePolicy}, "policy",
		"inode lock `policy`: exclusive, unlocked-below-eof, shared-written or shared-overwrite")
	fs.Var(enumFlag[store.IOMode]{&cfg.Store.IO, store.ParseIOMode}, "io",
		"I/O `mode`: buffered (page cache) or direct (O_DIRECT)")
	fs.Var(enumFlag[store.FsyncMode]{&cfg.Store.Fsync, store.ParseFsyncMode}, "fsync",
		"how concurrent syncs of a file combine (`mode`): group, per-call or timer")
	fs.Var(enumFlag[store.SyncedWriteMode]{&cfg.Store.SyncedWrites, store.ParseSyncedWriteMode}, "synced-writes",
		"how a write with sync=data is made durable (`mode`): direct (an aligned write below EOF to a file that owes no other sync is written O_DIRECT|O_DSYNC, durable by itself, many at once) or fsync (it waits for a sync of the file, as --fsync combines them)")
	fs.Var(sizeFlag(&cfg.Store.MaxFileSize, 1), "max-file-size",
		"largest `size` any request may give a file (bytes, or with k, m, g or t: 4k = 4KiB)")
	fs.Var(sizeFlag(&cfg.Store.MaxRequestBytes, 1), "max-request-bytes",
		"largest `size` of the data of one Write or Read (bytes, or with k, m, g or t: 4k = 4KiB)")
	fs.Var(sizeFlag(&cfg.MaxStreamBytes, 1), "max-stream-bytes",
		"most `bytes` of unacknowledged writes one WriteStream holds (each write counts its data plus 256, against --max-inflight-bytes too); at it the stream reads no more until acks go out")
	fs.DurationVar(&cfg.StreamIdleTimeout, "stream-idle-timeout", cfg.StreamIdleTimeout,
		"a WriteStream that goes this long without a message and without a write to apply or acknowledge is ended (UNAVAILABLE, STREAM_IDLE), giving back its file")
	fs.IntVar(&cfg.MaxFilesPerStream, "max-files-per-stream", cfg.MaxFilesPerStream,
		"most `files` one WriteStream holds declared at once (each also counts against --max-open-files); a declaration past it fails with TOO_MANY_FILES_ON_STREAM")
	fs.DurationVar(&cfg.ShutdownDelay, "shutdown-delay", cfg.ShutdownDelay,
		"on SIGINT/SIGTERM, how long to go on serving everything while health says NOT_SERVING and /readyz 503, before draining: the time load balancers take to see it (0: drain at once)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout,
		"on SIGINT/SIGTERM, how long to wait for requests in flight before cancelling them")
	// Authentication, TLS and resource limits (docs/guarantees.md).
	fs.StringVar(&cfg.AuthTokenFile, "auth-token-file", cfg.AuthTokenFile,
		"`file` of bearer tokens, one per line, reread on SIGHUP; every RPC but health then needs one")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate `file`: both listeners serve TLS (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM private key `file` of --tls-cert")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", cfg.TLSClientCA,
		"PEM `file` of CAs whose client certificates authenticate, each as its cert= line of --auth-token-file (mTLS)")
	fs.BoolVar(&cfg.InsecureListen, "insecure-listen", cfg.InsecureListen,
		"allow a listen address beyond loopback without --auth-token-file")
	fs.BoolVar(&cfg.RequirePathHeader, "require-path-header", cfg.RequirePathHeader,
		"refuse a call on a file without the filewrite-path routing header (FAILED_PRECONDITION): for a daemon of a cluster; List and health are exempt")
	fs.DurationVar(&cfg.ConnAuthTimeout, "conn-auth-timeout", cfg.ConnAuthTimeout,
		"how long a new connection may go without an authenticated request (without tokens: any request) before it is closed")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout,
		"a REST request body must deliver 64 KiB (or its end) within each such period, or the request fails with 408")
	fs.Func("http-allowed-origins", "comma-separated `origins` (scheme://host[:port], or *) whose web pages may call the REST listener: CORS on /v1/files, /v1/dirs, /v1/uploads and /dav (credentials for the origins named), and past the cross-site guard when there is no --auth-token-file (default none)",
		func(v string) error { cfg.HTTPAllowedOrigins = splitList(v); return nil })
	fs.Func("http-allowed-hosts", "comma-separated host `names` (or *) the REST listener answers to when there is no --auth-token-file, besides IP addresses, localhost and --http-addr's host (against DNS rebinding)",
		func(v string) error { cfg.HTTPAllowedHosts = splitList(v); return nil })
	fs.DurationVar(&cfg.UploadExpiry, "upload-expiry", cfg.UploadExpiry,
		"how long a tus upload under /v1/uploads/ may go without a PATCH before it is removed with its bytes, and how long a complete one is remembered")
	fs.Var(sizeFlag(&cfg.MaxInflightBytes, 1), "max-inflight-bytes",
		"bound on the memory held by requests in flight, daemon-wide (gRPC messages, REST bodies, Reads, and the writes WriteStreams hold unacknowledged); past it requests and streams wait (bytes, or with k, m, g or t)")
	fs.Var(countFlag(&cfg.Procs, 0), "procs",
		"how many threads run the daemon's Go code at once (GOMAXPROCS); 0: the GOMAXPROCS variable if set, else the CPUs. 1 speeds up streams on a machine of two CPUs shared with the clients, and slows unary calls")
	fs.Var(countFlag(&cfg.Store.MaxOpenFiles, 1), "max-open-files",
		"most `files` held open at once; idle ones are closed to make room, and past it a request is RESOURCE_EXHAUSTED (the default is derived from RLIMIT_NOFILE: a quarter kept for connections, halved with --io=direct, at most 16384)")
	fs.Var(sizeOrOff{&cfg.Store.ExtentCacheBytes}, "extent-cache-size",
		"memory (`size`) for the extent maps of files closed to make room, reused when one reopens unchanged; past it the oldest are dropped, and rebuilt with FIEMAP on reopen (0: none)")
	fs.Var(sizeOrOff{&cfg.Store.MapFileBytes}, "map-file-size",
		"largest file (`size`) whose overwrites may go through a shared memory mapping instead of pwrite: once a file keeps being overwritten, writes to its written, cached and densely written regions are copies without a syscall (0: always pwrite)")
	fs.Var(countFlag(&cfg.Store.MaxWaitersPerFile, 0), "max-waiters-per-file",
		"most `requests` that may queue for one file's lock; past it a request is RESOURCE_EXHAUSTED (0: unbounded)")
	logs := &logFlags{level: "info", format: "text"}
	fs.StringVar(&logs.level, "log-level", logs.level, "debug (every RPC), info, warn or error")
	fs.StringVar(&logs.format, "log-format", logs.format, "text or json, on standard error")
	return logs
}

// deriveDefaults redoes, after parsing, the defaults that depend on
// another flag: the bound on open files (from RLIMIT_NOFILE in
// service.DefaultConfig) halves with --io=direct, where each file holds
// two descriptors. A flag given explicitly, on the command line or by its
// environment variable (setFromEnv sets it through fs, so fs.Visit sees
// it), is left as given.
func deriveDefaults(fs *flag.FlagSet, cfg *service.Config) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["max-open-files"] {
		cfg.Store.MaxOpenFiles = store.MaxOpenFilesFor(store.NoFileLimit(), cfg.Store.IO)
	}
}

type logFlags struct{ level, format string }

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationAsString}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", l.format)
}

// durationAsString writes a duration as Go writes it ("30s", "1.5ms") in
// both formats: slog's JSON handler would write integer nanoseconds, which
// no reader takes for a duration.
func durationAsString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// enumFlag is a flag parsed by one of store's Parse functions. String shows
// the current value, so -help prints the default.
type enumFlag[T fmt.Stringer] struct {
	dst   *T
	parse func(string) (T, error)
}

func (f enumFlag[T]) String() string {
	if f.dst == nil { // the flag package probes a zero flag.Value
		return ""
	}
	return (*f.dst).String()
}

func (f enumFlag[T]) Set(s string) error {
	v, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.dst = v
	return nil
}

// atLeast is a numeric flag of at least min, read by parse and shown by
// format: a size (sizeFlag) or a count (countFlag). A limit's min is 1:
// none of them takes 0 to mean "no limit" or "the default", so a 0 is
// refused rather than guessed at; a flag whose 0 means something (as
// "unbounded") has min 0 and says so in its usage.
type atLeast[T int | int64] struct {
	dst    *T
	min    T
	unit   string // follows min in the error: " bytes" for a size
	parse  func(string) (T, error)
	format func(T) string
}

// sizeFlag is a size flag, read by bytesize.Parse, of at least floor bytes.
func sizeFlag(dst *int64, floor int64) atLeast[int64] {
	return atLeast[int64]{dst, floor, " bytes", bytesize.Parse, bytesize.Format}
}

// countFlag is an integer flag of at least floor.
func countFlag(dst *int, floor int) atLeast[int] {
	return atLeast[int]{dst, floor, "", parseCount, strconv.Itoa}
}

func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return n, nil
}

func (f atLeast[T]) String() string {
	if f.dst == nil { // the flag package probes a zero flag.Value
		return ""
	}
	return f.format(*f.dst)
}

func (f atLeast[T]) Set(s string) error {
	n, err := f.parse(s)
	if err != nil {
		return err
	}
	if n < f.min {
		return fmt.Errorf("%s is below the minimum of %d%s", s, f.min, f.unit)
	}
	*f.dst = n
	return nil
}

// sizeOrOff is --extent-cache-size and --map-file-size: a size where 0
// turns the feature off, which store.Options says with a negative value
// (its zero means the default).
type sizeOrOff struct{ dst *int64 }

func (f sizeOrOff) String() string {
	switch {
	case f.dst == nil:
		return ""
	case *f.dst < 0:
		return "0"
	}
	return bytesize.Format(*f.dst)
}

func (f sizeOrOff) Set(s string) error {
	n, err := bytesize.Parse(s)
	if err != nil {
		return err
	}
	if n == 0 {
		n = -1
	}
	*f.dst = n
	return nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

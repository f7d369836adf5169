package service

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/filewrite/filewrite/service/internal/admit"
	"github.com/filewrite/filewrite/service/internal/gateway"
	"github.com/filewrite/filewrite/service/internal/nbd"
	"github.com/filewrite/filewrite/service/internal/origin"
	"github.com/filewrite/filewrite/service/internal/uploads"
	"github.com/filewrite/filewrite/store"
)

// Config is what the daemon starts with; main fills it from flags, tests
// from DefaultConfig.
type Config struct {
	// Root is the directory whose files are served; created if missing.
	Root string
	// GRPCAddr is the gRPC listen address, host:port (port 0 picks a free
	// port) or unix:PATH for a unix socket.
	GRPCAddr string
	// HTTPAddr is the REST gateway's listen address; empty disables it.
	HTTPAddr string
	// PprofAddr is where net/http/pprof is served, host:port; empty (the
	// default) serves none. Loopback only, unless InsecureListen.
	PprofAddr string
	// TraceURLTemplate is where /debug/locks links a trace id to: an
	// http or https URL with {trace_id} in it, and {span_id} if the
	// viewer takes one (Jaeger's "http://jaeger:16686/trace/{trace_id}").
	// Empty: trace ids are shown without links.
	TraceURLTemplate string
	// NBDAddr is the NBD listen address (docs/nbd.md), host:port or
	// unix:PATH (a socket of mode 0660); empty (the default) serves no
	// NBD. With AuthTokenFile it needs TLSClientCA: a client certificate
	// is NBD's only credential.
	NBDAddr string
	// Store configures the engine: policy, I/O mode, fsync mode and the
	// limits. Its MaxRequestBytes bounds the data of one Write or Read on
	// both listeners too: gRPC messages and HTTP bodies may be larger by
	// what carries that data (the path, base64 in JSON).
	Store store.Options
	// MaxStreamBytes bounds the unacknowledged writes one WriteStream
	// holds, each counted as its data plus a fixed overhead; at the bound
	// the stream reads no further message until acks go out.
	MaxStreamBytes int64
	// StreamIdleTimeout is how long a WriteStream may go without a
	// message, and without a write to apply or acknowledge, before the
	// daemon ends it with STREAM_IDLE, giving back the file it holds.
	StreamIdleTimeout time.Duration
	// MaxFilesPerStream bounds the files one WriteStream holds declared
	// at once (TOO_MANY_FILES_ON_STREAM past it).
	MaxFilesPerStream int
	// ShutdownDelay is how long a shutdown goes on serving everything,
	// new connections and calls included, after health turns NOT_SERVING
	// (and /readyz 503) and before the drain begins: the time load
	// balancers need to see, through their probes, that the daemon leaves.
	// 0 drains at once.
	ShutdownDelay time.Duration
	// DrainTimeout bounds how long a shutdown waits for requests in flight
	// before it cancels them.
	DrainTimeout time.Duration
	// Logger receives the daemon's logs; nil means slog.Default().
	Logger *slog.Logger

	// Security: see auth.go, tls.go and security.go.

	// AuthTokenFile names a file of bearer tokens, one per line, reread on
	// SIGHUP; empty turns authentication off.
	AuthTokenFile string
	// TLSCert and TLSKey are PEM files; given together, both listeners
	// serve TLS.
	TLSCert, TLSKey string
	// TLSClientCA is a PEM file of the CAs whose client certificates the
	// listeners verify (mTLS); a verified certificate authenticates as its
	// cert= line in AuthTokenFile. Empty: no client certificates asked.
	TLSClientCA string
	// InsecureListen allows a listen address beyond loopback without
	// AuthTokenFile.
	InsecureListen bool
	// ConnAuthTimeout is how long a new connection to either listener
	// may go without an authenticated request (without AuthTokenFile: any
	// request) before it is closed; it bounds the gRPC handshake too.
	ConnAuthTimeout time.Duration
	// BodyTimeout is how long a REST request body may take to deliver each
	// 64 KiB (or its end) before the request fails with 408.
	BodyTimeout time.Duration
	// HTTPAllowedOrigins and HTTPAllowedHosts widen what the REST listener
	// takes from browsers when AuthTokenFile is empty: the Origin values
	// let through, and host names besides IP literals, localhost and
	// HTTPAddr's own (see origin.BrowserGuard). "*" lets any through.
	HTTPAllowedOrigins, HTTPAllowedHosts []string
	// UploadExpiry is how long a tus upload may go without a PATCH before
	// it is removed with its bytes, and how long a complete one is
	// remembered (docs/uploads.md).
	UploadExpiry time.Duration
	// MaxInflightBytes bounds the memory that requests in flight hold,
	// daemon-wide (see admit.Budget); past it requests wait.
	MaxInflightBytes int64
	// Procs is how many threads run the daemon's Go code at once
	// (runtime.GOMAXPROCS), set by Run; 0 leaves the runtime's number
	// (the GOMAXPROCS variable, or the CPUs).
	Procs int
	// RequirePathHeader refuses a call on a file that carries no routing
	// header (FAILED_PRECONDITION): for a daemon of a cluster, where such
	// a call was routed by nothing. List and health are exempt.
	RequirePathHeader bool

	// WrapFS, when set, wraps the file layer under the store: tests inject
	// faults (ENOSPC, a held sync) through it. nil in production.
	WrapFS func(store.FS) store.FS

	// TracerProvider receives the daemon's spans; nil means one built from
	// the OTEL_* environment variables (see telemetry.go), off unless
	// OTEL_TRACES_EXPORTER or an OTLP endpoint is set. The daemon does not
	// shut down a provider given here.
	TracerProvider trace.TracerProvider
	// freshLastModified gives a file its Last-Modified at once, however
	// recently it changed, rather than after
	// gateway.DefaultLastModifiedDelay: set by tests only.
	freshLastModified bool
}

// lastModifiedDelay is how long a changed file goes without a
// Last-Modified.
func lastModifiedDelay(c Config) time.Duration {
	if c.freshLastModified {
		return 0
	}
	return gateway.DefaultLastModifiedDelay
}

// MaxRequestBytesLimit is the largest Store.MaxRequestBytes accepted: a request is
// held in memory more than once on its way (HTTP body, gRPC message), and
// gRPC frames a message with a 32-bit length.
const MaxRequestBytesLimit = 1 << 30

// DefaultConfig is the daemon's configuration when no flag is given: the
// store's defaults (store.DefaultOptions) but for two that a daemon sets
// otherwise, and the service's own.
func DefaultConfig() Config {
	st := store.DefaultOptions()
	// The bound on open files comes from the descriptor limit (a library
	// user has no such limit to share), and a file's lock queue is bounded
	// (see DefaultMaxWaitersPerFile).
	st.MaxOpenFiles = store.MaxOpenFilesFor(store.NoFileLimit(), st.IO)
	st.MaxWaitersPerFile = DefaultMaxWaitersPerFile
	return Config{
		Root:              "./data",
		GRPCAddr:          "127.0.0.1:50051",
		HTTPAddr:          "127.0.0.1:8080",
		Store:             st,
		MaxStreamBytes:    DefaultMaxStreamBytes,
		StreamIdleTimeout: DefaultStreamIdleTimeout,
		MaxFilesPerStream: DefaultMaxFilesPerStream,
		DrainTimeout:      30 * time.Second,
		ConnAuthTimeout:   DefaultConnAuthTimeout,
		BodyTimeout:       DefaultBodyTimeout,
		UploadExpiry:      uploads.DefaultExpiry,
		MaxInflightBytes:  DefaultMaxInflightBytes,
	}
}

// Validate refuses a configuration Start cannot use, with a *ConfigError
// that names the setting. The store's options are the store's to check
// (store.Options.Validate): 0 there means the store's default. Start
// validates too; main validates first, to name its flags instead.
func (c Config) Validate() error {
	if c.Root == "" {
		return &ConfigError{"Root", "is empty"}
	}
	if c.GRPCAddr == "" {
		return &ConfigError{"GRPCAddr", "is empty"}
	}
	if err := c.Store.Validate(); err != nil {
		if oe, ok := errors.AsType[*store.OptionError](err); ok {
			return &ConfigError{"Store." + oe.Option, oe.Problem}
		}
		return err
	}
	st := c.Store.WithDefaults()
	if st.MaxRequestBytes > MaxRequestBytesLimit {
		return &ConfigError{"Store.MaxRequestBytes", fmt.Sprintf("is %d: want at most %d (1 GiB): a request is held in memory more than once, "+
			"and gRPC frames a message with a 32-bit length", st.MaxRequestBytes, MaxRequestBytesLimit)}
	}
	for _, f := range []struct {
		name string
		bad  bool
		min  string
		v    any
	}{
		{"MaxStreamBytes", c.MaxStreamBytes <= 0, "at least 1", c.MaxStreamBytes},
		{"StreamIdleTimeout", c.StreamIdleTimeout <= 0, "more than 0", c.StreamIdleTimeout},
		{"MaxFilesPerStream", c.MaxFilesPerStream <= 0, "at least 1", c.MaxFilesPerStream},
		{"ShutdownDelay", c.ShutdownDelay < 0, "0 or more", c.ShutdownDelay},
		{"DrainTimeout", c.DrainTimeout < 0, "0 or more", c.DrainTimeout},
		{"ConnAuthTimeout", c.ConnAuthTimeout <= 0, "more than 0", c.ConnAuthTimeout},
		{"BodyTimeout", c.BodyTimeout <= 0, "more than 0", c.BodyTimeout},
		{"UploadExpiry", c.UploadExpiry <= 0, "more than 0", c.UploadExpiry},
	} {
		if f.bad {
			return &ConfigError{f.name, fmt.Sprintf("is %v: want %s", f.v, f.min)}
		}
	}
	if _, err := origin.NewBrowserGuard(c.HTTPAddr, c.HTTPAllowedOrigins, c.HTTPAllowedHosts); err != nil {
		return err
	}
	if err := checkTraceURLTemplate(c.TraceURLTemplate); err != nil {
		return err
	}
	if c.NBDAddr != "" && st.MaxRequestBytes < nbd.MinPayload {
		return &ConfigError{"Store.MaxRequestBytes", fmt.Sprintf("is %d: serving NBD needs at least %d (NBD's preferred block "+
			"size, the least maximum payload it may advertise)", st.MaxRequestBytes, nbd.MinPayload)}
	}
	if least := admit.MinInflightBytes(st.MaxRequestBytes); c.MaxInflightBytes < least {
		return &ConfigError{"MaxInflightBytes", fmt.Sprintf("is %d: want at least %d, what a gRPC message of the largest request "+
			"(%d bytes of data) holds while it is received", c.MaxInflightBytes, least, st.MaxRequestBytes)}
	}
	return nil
}

// checkTraceURLTemplate accepts "" or an absolute http or https URL that
// names {trace_id}, once filled in.
func checkTraceURLTemplate(t string) error {
	if t == "" {
		return nil
	}
	if !strings.Contains(t, "{trace_id}") {
		return &ConfigError{"TraceURLTemplate", fmt.Sprintf("%q names no {trace_id}", t)}
	}
	u, err := url.Parse(traceURL(t, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &ConfigError{"TraceURLTemplate", fmt.Sprintf("%q: want an http or https URL, like http://jaeger:16686/trace/{trace_id}", t)}
	}
	return nil
}

// ConfigError is Validate's refusal of one setting. main names the flag
// that sets it instead of Field.
type ConfigError struct {
	// Field is the setting as Go spells it in Config: "MaxStreamBytes",
	// or "Store.MaxFileSize" for one of the store's options.
	Field string
	// Problem says what its value is, what is wrong with it, and what
	// would do: "is 0: want at least 1".
	Problem string
}

func (e *ConfigError) Error() string { return e.Field + " " + e.Problem }

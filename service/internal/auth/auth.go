package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/status"
)
import ()

// Tokens checks bearer tokens on both protocols. The gRPC servers' tap
// is the authority: the gateway forwards the caller's Authorization header
// to its gRPC server as "authorization" metadata (runtime.AnnotateContext
// does), so a REST call is checked where a gRPC call is, and the gateway
// holds no credential of its own that could let a request through. The HTTP
// middleware checks the same tokens once more in front of the gateway, so
// that a stranger's request is refused before its body is read.
//
// Only the gRPC health service is open: load balancers and orchestrators
// probe it without credentials. Everything else, reflection and whatever
// the HTTP listener serves (such as /metrics) included, needs a token.
type Tokens struct {
	file string
	log  *slog.Logger
	// Root is --root with its symbolic links resolved, set by Start once
	// the store has opened it: authorize resolves paths against it. ""
	// when it could not be resolved (then the store alone decides).
	Root string

	// creds holds the credentials in force. A reload swaps in a new
	// *credentialSet and never changes one in place, so checks read it
	// without a lock.
	creds atomic.Pointer[credentialSet]

	// reloadMu serialises reloads, so that of two reloads racing (SIGHUP
	// and ReloadAuth) the file read last is the one installed.
	reloadMu sync.Mutex
	// afterReload runs after each reload that installed new credentials,
	// before Reload returns (AfterReload). Guarded by reloadMu.
	afterReload []func()
}

// AfterReload has f run after every successful reload, before Reload
// returns: a door that holds what an earlier check allowed (an NBD export
// in use) narrows it there, so that no request it reads after the reload
// returned is served under the old credentials. f must not reload.
func (a *Tokens) AfterReload(f func()) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	a.afterReload = append(a.afterReload, f)
}

// credentialSet is one reading of the token file.
type credentialSet struct {
	// digests holds the SHA-256 of every token, and scopes each one's
	// scope (the same index).
	digests [][sha256.Size]byte
	scopes  []*scope
	// certs maps a client certificate's identity (certIdentity) to its
	// scope, from the file's cert= lines.
	certs map[string]*scope
	// changed is closed when a reload replaces these credentials: a
	// stream watches it to look its credential up again (watchAuth).
	changed chan struct{}
}

// identity is what a request authenticated with, kept in its context so
// that its scope can be looked up again after a reload: a token's digest,
// or a client certificate's identity.
type identity struct {
	digest [sha256.Size]byte
	cert   string
}

type identityKey struct{}

// identityFrom is the identity the call's tap or the HTTP middleware
// found, if any.
func identityFrom(ctx context.Context) (identity, bool) {
	id, ok := ctx.Value(identityKey{}).(identity)
	return id, ok
}

// Changed is closed when a reload replaces the credentials in force now;
// nil (never closed) without tokens.
func (a *Tokens) Changed() <-chan struct{} {
	if a == nil {
		return nil
	}
	return a.creds.Load().changed
}

// NewTokens reads file, which must hold at least one credential.
func NewTokens(file string, log *slog.Logger) (*Tokens, error) {
	a := &Tokens{file: file, log: log}
	if err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// readCredentials parses a token file (docs/security.md): one credential
// per line, surrounding blanks trimmed; empty lines and lines starting
// with '#' are skipped. A line is a token, or cert=IDENTITY for a client
// certificate, then optional scope words (parseScopeWords). A token may not
// contain blanks (they separate the words) nor start with "cert=".
func readCredentials(file string) (*credentialSet, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read auth token file: %w", err)
	}
	c := &credentialSet{certs: make(map[string]*scope), changed: make(chan struct{})}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		words := strings.Fields(text)
		scope, err := parseScopeWords(words[1:], line)
		if err != nil {
			return nil, fmt.Errorf("auth token file %s, line %d: %w", file, line, err)
		}
		if cert, ok := strings.CutPrefix(words[0], "cert="); ok {
			if cert == "" {
				return nil, fmt.Errorf("auth token file %s, line %d: cert= names no identity", file, line)
			}
			if _, dup := c.certs[cert]; dup {
				return nil, fmt.Errorf("auth token file %s, line %d: cert=%s is given twice", file, line, cert)
			}
			c.certs[cert] = scope
			continue
		}
		c.digests = append(c.digests, sha256.Sum256([]byte(words[0])))
		c.scopes = append(c.scopes, scope)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth token file %s: %w", file, err)
	}
	if len(c.digests) == 0 && len(c.certs) == 0 {
		// An empty file would lock every client out, which is more likely
		// a mistake (a truncated file, a failed deploy) than a wish.
		return nil, fmt.Errorf("auth token file %s holds no token", file)
	}
	return c, nil
}

// Reload installs the credentials now in the file. On error the
// credentials in force stay, so a bad edit cannot lock every client out.
// Streams that authenticated with a credential the new file drops or
// narrows learn of it through the old credentials' changed channel.
func (a *Tokens) Reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	c, err := readCredentials(a.file)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(a.file); err == nil && fi.Mode().Perm()&0o077 != 0 {
		a.log.Warn("auth token file is readable by other users", "file", a.file, "mode", fi.Mode().Perm().String())
	}
	if old := a.creds.Swap(c); old != nil {
		close(old.changed)
	}
	for _, f := range a.afterReload {
		f()
	}
	return nil
}

// scopeOf is id's scope under the credentials in force; nil when the
// credential is no longer there (revoked by a reload).
func (a *Tokens) scopeOf(id identity) *scope {
	c := a.creds.Load()
	if id.cert != "" {
		return c.certs[id.cert]
	}
	for i, d := range c.digests {
		if d == id.digest {
			return c.scopes[i]
		}
	}
	return nil
}

var (
	errNoToken        = errors.New("missing bearer token: send \"authorization: Bearer <token>\"")
	errBadToken       = errors.New("invalid bearer token")
	errManyTokens     = errors.New("more than one authorization value: send exactly one")
	errNotBearerToken = errors.New("authorization is not a bearer token: send \"authorization: Bearer <token>\"")
	errUnmappedCert   = errors.New("the client certificate's identity has no cert= line in the token file, and no bearer token was sent")
)

// check accepts exactly one "Bearer <token>" value naming a valid token,
// and returns its identity. Every valid token is compared, in constant
// time and on the SHA-256 of both sides so that neither the length nor
// the position of a match shows in the time taken.
func (a *Tokens) check(values []string) (identity, error) {
	switch len(values) {
	case 0:
		return identity{}, errNoToken
	case 1:
	default:
		return identity{}, errManyTokens
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return identity{}, errNotBearerToken
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match := 0
	for _, want := range a.creds.Load().digests {
		match |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	if match != 1 {
		return identity{}, errBadToken
	}
	return identity{digest: got}, nil
}

// checkOrCert is check, except that a call without any authorization
// value that came with a verified client certificate mapped by a cert=
// line authenticates as that certificate (cert is "" without one).
func (a *Tokens) checkOrCert(values []string, cert string) (identity, error) {
	if len(values) == 0 && cert != "" {
		if a.creds.Load().certs[cert] == nil {
			return identity{}, errUnmappedCert
		}
		return identity{cert: cert}, nil
	}
	return a.check(values)
}

// checkCall checks the "authorization" metadata of an incoming RPC (or,
// without any, the client certificate cert: see checkOrCert) and returns
// its identity; a nil Tokens (authentication off) and the health
// service accept anything. It runs in the gRPC servers' tap (see
// AdmitCall), when the call's headers arrive: a refused call's message is
// never read, let alone decompressed.
func (a *Tokens) checkCall(method string, md metadata.MD, cert string) (identity, error) {
	if a == nil || strings.HasPrefix(method, status.HealthPrefix) {
		return identity{}, nil
	}
	id, err := a.checkOrCert(md.Get("authorization"), cert)
	if err != nil {
		return identity{}, unauthenticated(err).Err()
	}
	return id, nil
}

// GatewayCertMetadata carries, from the HTTP middleware to the gateway's
// own gRPC server, the identity of the client certificate a REST request
// came with. The middleware puts it in the request's context
// (certIdentityKey), which no client can write, and the gateway turns it
// into this metadata (GatewayMetadata); the gateway forwards no client
// header as metadata but Authorization, and only the gateway's server,
// reached over an in-process pipe, reads it.
const GatewayCertMetadata = "filewrite-client-cert"

type certIdentityKey struct{}

// GatewayMetadata is the gateway's runtime.WithMetadata: the verified
// client certificate's identity of a request that sent no token.
func GatewayMetadata(ctx context.Context, _ *http.Request) metadata.MD {
	if cert, ok := ctx.Value(certIdentityKey{}).(string); ok {
		return metadata.Pairs(GatewayCertMetadata, cert)
	}
	return nil
}

// Tap is checkCall as the gateway's gRPC server's grpc.InTapHandle: the
// identity goes into the call's context for authorize.
func (a *Tokens) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	var cert string
	if v := info.Header.Get(GatewayCertMetadata); len(v) == 1 {
		cert = v[0]
	}
	id, err := a.checkCall(info.FullMethodName, info.Header, cert)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, identityKey{}, id), nil
}

// HTTPMiddleware refuses requests without a valid token (or mapped client
// certificate) with 401 and the gateway's JSON error body, before the
// gateway reads the body or calls the gRPC server. A
// Grpc-Metadata-Authorization header counts as a second credential: the
// gateway would forward it as "authorization" metadata next to the real
// one. GET /debug/locks names every open file, and GET /debug/nbd every
// export in use, so they are for an administrator's credential only
// (scope.admin); /metrics carries no path.
//
// A request let through vouches for its connection (see GuardedListener);
// without tokens, every request does.
func (a *Tokens) HTTPMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a != nil {
			values := r.Header.Values("Authorization")
			values = append(values, r.Header.Values("Grpc-Metadata-Authorization")...)
			cert := requestCertIdentity(r)
			id, err := a.checkOrCert(values, cert)
			if err != nil {
				writeUnauthenticated(w, err)
				return
			}
			ctx := context.WithValue(r.Context(), identityKey{}, id)
			if len(values) == 0 && cert != "" {
				ctx = context.WithValue(ctx, certIdentityKey{}, cert)
			}
			r = r.WithContext(ctx)
			if r.URL.Path == "/debug/locks" || r.URL.Path == "/debug/nbd" {
				if sc := a.scopeOf(id); !sc.admin() {
					a.log.Info("refused: "+r.URL.Path+" needs an unscoped credential", "credential", sc.label())
					status.WriteHTTP(w, http.StatusForbidden, status.NewRefusal(filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE, nil,
						r.URL.Path+" shows every tenant's paths: it needs a credential without prefix= or mode=ro"))
					return
				}
			}
		}
		TrustConn(r.Context())
		next.ServeHTTP(w, r)
	})
}

// unauthenticated is the status of a call that check refused.
func unauthenticated(err error) *grpcstatus.Status {
	reason := filewritev1.ErrorReason_TOKEN_MISSING
	if errors.Is(err, errBadToken) {
		reason = filewritev1.ErrorReason_TOKEN_INVALID
	}
	return status.NewRefusal(reason, nil, err.Error())
}

// writeUnauthenticated answers like the gateway answers an UNAUTHENTICATED
// status: 401 with {"code":16,"message":...,"details":[ErrorInfo]}.
func writeUnauthenticated(w http.ResponseWriter, err error) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="filewrite"`)
	status.WriteHTTP(w, http.StatusUnauthorized, unauthenticated(err))
}

// AdmitCall is the public gRPC server's tap: a call without a valid token
// is refused when its headers arrive. A call that is let in with a valid
// token (or any call, without tokens) vouches for its connection (see
// GuardedListener); health needs no token, so it vouches only if it
// carries a valid one.
func (a *Tokens) AdmitCall(ctx context.Context, info *tap.Info) (context.Context, error) {
	switch {
	case a == nil:
	case strings.HasPrefix(info.FullMethodName, status.HealthPrefix):
		if _, err := a.check(info.Header.Get("authorization")); err != nil {
			return ctx, nil
		}
	default:
		id, err := a.checkCall(info.FullMethodName, info.Header, peerCertIdentity(ctx))
		if err != nil {
			return nil, err
		}
		ctx = context.WithValue(ctx, identityKey{}, id)
	}
	TrustConn(ctx)
	return ctx, nil
}

// ReloadLogged is a reload that logs its outcome: a failed reload keeps
// the tokens in force.
func (a *Tokens) ReloadLogged() {
	if err := a.Reload(); err != nil {
		a.log.Error("auth tokens not reloaded; the previous ones stay in force", "error", err)
		return
	}
	c := a.creds.Load()
	a.log.Info("auth tokens reloaded", "file", a.file, "tokens", len(c.digests), "certs", len(c.certs))
}

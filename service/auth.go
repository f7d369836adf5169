package service

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
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/encoding/protojson"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// tokenAuth checks bearer tokens on both protocols. The gRPC servers' tap
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
type tokenAuth struct {
	file string
	log  *slog.Logger

	// digests holds the SHA-256 of every valid token. A reload swaps in a
	// new slice and never changes one in place, so checks read it without
	// a lock.
	digests atomic.Pointer[[][sha256.Size]byte]

	// reloadMu serialises reloads, so that of two reloads racing (SIGHUP
	// and ReloadAuth) the file read last is the one installed.
	reloadMu sync.Mutex
}

// openHealthPrefix is the gRPC method prefix that needs no token.
const openHealthPrefix = "/grpc.health.v1.Health/"

// newTokenAuth reads file, which must hold at least one token.
func newTokenAuth(file string, log *slog.Logger) (*tokenAuth, error) {
	a := &tokenAuth{file: file, log: log}
	if err := a.reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// readTokens parses a token file: one token per line, surrounding blanks
// trimmed; empty lines and lines starting with '#' are skipped. A token
// may not contain blanks, which would make "Bearer a b" ambiguous.
func readTokens(file string) ([][sha256.Size]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read auth token file: %w", err)
	}
	var out [][sha256.Size]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		tok := strings.TrimSpace(sc.Text())
		if tok == "" || strings.HasPrefix(tok, "#") {
			continue
		}
		if strings.ContainsAny(tok, " \t") {
			return nil, fmt.Errorf("auth token file %s, line %d: a token may not contain blanks", file, line)
		}
		out = append(out, sha256.Sum256([]byte(tok)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth token file %s: %w", file, err)
	}
	if len(out) == 0 {
		// An empty file would lock every client out, which is more likely
		// a mistake (a truncated file, a failed deploy) than a wish.
		return nil, fmt.Errorf("auth token file %s holds no token", file)
	}
	return out, nil
}

// reload installs the tokens now in the file. On error the tokens in force
// stay, so a bad edit cannot lock every client out.
func (a *tokenAuth) reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	digests, err := readTokens(a.file)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(a.file); err == nil && fi.Mode().Perm()&0o077 != 0 {
		a.log.Warn("auth token file is readable by other users", "file", a.file, "mode", fi.Mode().Perm().String())
	}
	a.digests.Store(&digests)
	return nil
}

var (
	errNoToken        = errors.New("missing bearer token: send \"authorization: Bearer <token>\"")
	errBadToken       = errors.New("invalid bearer token")
	errManyTokens     = errors.New("more than one authorization value: send exactly one")
	errNotBearerToken = errors.New("authorization is not a bearer token: send \"authorization: Bearer <token>\"")
)

// check accepts exactly one "Bearer <token>" value naming a valid token.
// Every valid token is compared, in constant time and on the SHA-256 of
// both sides so that neither the length nor the position of a match shows
// in the time taken.
func (a *tokenAuth) check(values []string) error {
	switch len(values) {
	case 0:
		return errNoToken
	case 1:
	default:
		return errManyTokens
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return errNotBearerToken
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match := 0
	for _, want := range *a.digests.Load() {
		match |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	if match != 1 {
		return errBadToken
	}
	return nil
}

// checkCall checks the "authorization" metadata of an incoming RPC; a nil
// tokenAuth (authentication off) and the health service accept anything.
// It runs in the gRPC servers' tap (see admitCall), when the call's headers
// arrive: a refused call's message is never read, let alone decompressed.
func (a *tokenAuth) checkCall(method string, md metadata.MD) error {
	if a == nil || strings.HasPrefix(method, openHealthPrefix) {
		return nil
	}
	if err := a.check(md.Get("authorization")); err != nil {
		return unauthenticated(err).Err()
	}
	return nil
}

// tap is checkCall as a grpc.InTapHandle.
func (a *tokenAuth) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if err := a.checkCall(info.FullMethodName, info.Header); err != nil {
		return nil, err
	}
	return ctx, nil
}

// httpMiddleware refuses requests without a valid token with 401 and the
// gateway's JSON error body, before the gateway reads the body or calls the
// gRPC server. A Grpc-Metadata-Authorization header counts as a second
// credential: the gateway would forward it as "authorization" metadata
// next to the real one.
//
// A request let through vouches for its connection (see guardedListener);
// without tokens, every request does.
func (a *tokenAuth) httpMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a != nil {
			values := r.Header.Values("Authorization")
			values = append(values, r.Header.Values("Grpc-Metadata-Authorization")...)
			if err := a.check(values); err != nil {
				writeUnauthenticated(w, err)
				return
			}
		}
		trustConn(r.Context())
		next.ServeHTTP(w, r)
	})
}

// unauthenticated is the status of a call that check refused.
func unauthenticated(err error) *status.Status {
	reason := filewritev1.ErrorReason_TOKEN_MISSING
	if errors.Is(err, errBadToken) {
		reason = filewritev1.ErrorReason_TOKEN_INVALID
	}
	return newRefusal(reason, nil, err.Error())
}

// writeUnauthenticated answers like the gateway answers an UNAUTHENTICATED
// status: 401 with {"code":16,"message":...,"details":[ErrorInfo]}.
func writeUnauthenticated(w http.ResponseWriter, err error) {
	body, merr := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(unauthenticated(err).Proto())
	if merr != nil {
		body = []byte(`{"code":16,"message":"unauthenticated","details":[]}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("WWW-Authenticate", `Bearer realm="filewrite"`)
	w.WriteHeader(http.StatusUnauthorized)
	w.Write(body)
}

// reloadOnSIGHUP is what a SIGHUP does: reread --auth-token-file, or,
// without one, nothing but a log line. A failed reload is logged and keeps
// the tokens in force.
func (s *Server) reloadOnSIGHUP() {
	if s.auth == nil {
		s.log.Info("SIGHUP ignored: there is no --auth-token-file to reread")
		return
	}
	if err := s.auth.reload(); err != nil {
		s.log.Error("auth tokens not reloaded; the previous ones stay in force", "error", err)
		return
	}
	s.log.Info("auth tokens reloaded", "file", s.auth.file, "tokens", len(*s.auth.digests.Load()))
}

// ReloadAuth rereads --auth-token-file, as SIGHUP does. It fails when
// authentication is off or the file holds no valid token; then the tokens
// in force stay.
func (s *Server) ReloadAuth() error {
	if s.auth == nil {
		return errors.New("authentication is off: no --auth-token-file")
	}
	return s.auth.reload()
}

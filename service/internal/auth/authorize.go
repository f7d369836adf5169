package auth

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/status"
)

// Scoped credentials (docs/security.md): a token or certificate whose
// line in --auth-token-file has prefix= or mode=ro reaches only the paths
// and the access its scope allows. The tap (AdmitCall, Tokens.Tap) has
// put the call's identity in its context; authorize looks its scope up in
// the credentials in force, so that a reload narrows calls that start
// after it, and streams open at the time (watchAuth).

// Authorize refuses, with PERMISSION_DENIED, a call whose credential may
// not do acc on every one of paths; with UNAUTHENTICATED one whose
// credential a reload removed. A nil Tokens (no --auth-token-file)
// allows everything. A path that resolves through symbolic links inside
// --root is checked as written and as resolved: a link inside a tenant's
// prefix does not lead it into another's. Paths the store would refuse
// (absolute, leaving --root) are left to the store, which refuses them
// whatever the scope.
func (a *Tokens) Authorize(ctx context.Context, acc access, paths ...string) error {
	if a == nil {
		return nil
	}
	sc, err := a.callScope(ctx)
	if err != nil {
		return err
	}
	for _, p := range paths {
		if resolved, ok := a.scopeAllows(sc, acc, p); !ok {
			return a.refuse(sc, p, acc, resolved)
		}
	}
	return nil
}

// Allows reports whether the credential in ctx may do acc on p, as
// Authorize decides, without logging a refusal: for a listing that leaves
// out what the credential may not reach (NBD_OPT_LIST), and for a door
// that serves what it may only read read-only (NBD).
func (a *Tokens) Allows(ctx context.Context, acc access, p string) bool {
	if a == nil {
		return true
	}
	sc, err := a.callScope(ctx)
	if err != nil {
		return false
	}
	_, ok := a.scopeAllows(sc, acc, p)
	return ok
}

// scopeAllows reports whether sc allows acc on p, as written and as
// resolved; when a symbolic link led out of the scope, resolved is where.
func (a *Tokens) scopeAllows(sc *scope, acc access, p string) (resolved string, ok bool) {
	if sc.admin() || (len(sc.prefixes) == 0 && acc == AccessRead) {
		return "", true
	}
	clean, err := cleanScopePath(p)
	if err != nil {
		return "", true // the store refuses it
	}
	if !sc.allows(clean, acc) {
		return "", false
	}
	if len(sc.prefixes) == 0 {
		return "", true // mode=ro everywhere: where a link leads does not matter
	}
	if real, ok := a.resolve(clean); ok && real != clean && !sc.allows(real, acc) {
		return real, false
	}
	return "", true
}

// callScope is the scope of the call's credential now.
func (a *Tokens) callScope(ctx context.Context) (*scope, error) {
	id, ok := identityFrom(ctx)
	if !ok {
		// Every call on a server with tokens passed a tap that set it;
		// one that did not (health) has no business with a path.
		return nil, status.NewRefusal(filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE, nil, "the call carries no credential").Err()
	}
	sc := a.scopeOf(id)
	if sc == nil {
		return nil, status.NewRefusal(filewritev1.ErrorReason_TOKEN_REVOKED, nil,
			"the credential this call authenticated with was removed from the token file").Err()
	}
	return sc, nil
}

// refuse logs a scope refusal (with the credential's label, never the
// token) and returns its status.
func (a *Tokens) refuse(sc *scope, p string, acc access, resolved string) error {
	md := map[string]string{"path": p, "access": acc.String(), "credential": sc.label()}
	msg := "the credential's scope does not allow " + acc.String() + " of " + p
	if resolved != "" {
		md["resolved"] = resolved
		msg += " (a symbolic link leads to " + resolved + ")"
	}
	if acc == AccessWrite && sc.readOnly {
		msg += ": the credential is mode=ro"
	}
	msg += " (its scope is its line of --auth-token-file)"
	args := []any{"credential", sc.label(), "path", p, "access", acc.String()}
	if resolved != "" {
		args = append(args, "resolved", resolved)
	}
	a.log.Info("refused by scope", args...)
	return status.NewRefusal(filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE, md, msg).Err()
}

// resolve is the clean path p (relative to --root) with every symbolic
// link resolved, relative to --root's own resolved path (Tokens.Root); for a path that
// does not exist yet, its longest existing parent is resolved and the rest
// appended. ok is false when it cannot be told (no root, a link leaving
// --root, an error other than "does not exist"): the store then decides,
// and refuses links that leave --root.
func (a *Tokens) resolve(p string) (string, bool) {
	root := a.Root
	if root == "" {
		return p, false
	}
	rest := ""
	cur := p
	for {
		real, err := filepath.EvalSymlinks(filepath.Join(root, filepath.FromSlash(cur)))
		if err == nil {
			rel, err := filepath.Rel(root, real)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
				return p, false
			}
			return path.Clean(path.Join(filepath.ToSlash(rel), rest)), true
		}
		if !errors.Is(err, fs.ErrNotExist) || cur == "." {
			return p, false
		}
		rest = path.Join(path.Base(cur), rest)
		cur = path.Dir(cur)
	}
}

// pathRequest is a request that names a file.
type pathRequest interface{ GetPath() string }

// UnaryAuthorize checks each request's paths against the call's scope
// before its handler runs, and filters what a List of an ancestor of the
// scope's prefixes answers.
func (a *Tokens) UnaryAuthorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if a == nil {
		return handler(ctx, req)
	}
	var err error
	switch r := req.(type) {
	case *filewritev1.ReadRequest, *filewritev1.StatRequest, *filewritev1.ExtentsRequest, *filewritev1.DigestRequest:
		err = a.Authorize(ctx, AccessRead, r.(pathRequest).GetPath())
	case *filewritev1.ListRequest:
		return a.authorizeList(ctx, r, handler)
	case *filewritev1.RenameRequest:
		err = a.Authorize(ctx, AccessWrite, r.GetPath(), r.GetNewPath())
	case pathRequest:
		// Every other request that names a file may change it (Write,
		// Fsync, Truncate, Fallocate, Delete, and any RPC added later):
		// a new RPC is checked as a write until it is listed above.
		err = a.Authorize(ctx, AccessWrite, r.GetPath())
	}
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// authorizeList allows a List of a directory the scope covers, and of an
// ancestor of its prefixes, whose answer then shows only the entries on
// the way to a prefix. A page may so come back shorter than asked (even
// empty) with a next_page_token: callers page on until it is "".
func (a *Tokens) authorizeList(ctx context.Context, r *filewritev1.ListRequest, handler grpc.UnaryHandler) (any, error) {
	sc, err := a.callScope(ctx)
	if err != nil {
		return nil, err
	}
	dir, cerr := cleanScopePath(r.GetPath())
	if sc.admin() || len(sc.prefixes) == 0 || cerr != nil {
		return handler(ctx, r)
	}
	ok, filtered := sc.listable(dir)
	if !ok {
		return nil, a.refuse(sc, r.GetPath(), AccessRead, "")
	}
	if real, rok := a.resolve(dir); rok && real != dir {
		if ok, _ := sc.listable(real); !ok {
			return nil, a.refuse(sc, r.GetPath(), AccessRead, real)
		}
	}
	resp, err := handler(ctx, r)
	if err != nil || !filtered {
		return resp, err
	}
	lr := resp.(*filewritev1.ListResponse)
	kept := lr.Entries[:0]
	for _, e := range lr.Entries {
		if sc.leadsTo(dir, e.GetName()) {
			kept = append(kept, e)
		}
	}
	lr.Entries = kept
	return lr, nil
}

// certIdentity is the identity of a client certificate that cert= lines
// name: its first URI SAN (a SPIFFE ID, say), else its first DNS SAN, else
// its subject's common name.
func certIdentity(c *x509.Certificate) string {
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	}
	return c.Subject.CommonName
}

// peerCertIdentity is the identity of the verified client certificate the
// gRPC call's connection presented, "" without one.
func peerCertIdentity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return certIdentity(info.State.VerifiedChains[0][0])
}

// requestCertIdentity is peerCertIdentity for a REST request.
func requestCertIdentity(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return ""
	}
	return certIdentity(r.TLS.VerifiedChains[0][0])
}

// Owner is a key for the credential of the call in ctx, for a door that
// ties what it keeps to the credential that made it (a tus upload): the
// SHA-256 of its token in hex, or "cert:" and its client certificate's
// identity; "" without tokens, or for a call that carries none.
func (a *Tokens) Owner(ctx context.Context) string {
	if a == nil {
		return ""
	}
	id, ok := identityFrom(ctx)
	switch {
	case !ok:
		return ""
	case id.cert != "":
		return "cert:" + id.cert
	}
	return hex.EncodeToString(id.digest[:])
}

// Home is the directory under which a door puts a file whose client names
// only the file (a tus upload's filename): the first prefix of the
// credential's scope, or "" (--root) for a credential without prefixes
// and without tokens. A read-only credential may write nowhere:
// PERMISSION_DENIED, as Authorize refuses it.
func (a *Tokens) Home(ctx context.Context) (string, error) {
	if a == nil {
		return "", nil
	}
	sc, err := a.callScope(ctx)
	if err != nil {
		return "", err
	}
	home := ""
	if len(sc.prefixes) > 0 {
		home = sc.prefixes[0]
	}
	if sc.readOnly {
		return "", a.refuse(sc, home, AccessWrite, "")
	}
	return home, nil
}

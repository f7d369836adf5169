package auth

import (
	"context"
	"crypto/tls"
	"errors"
)

// A connection that carries no token, such as NBD's, authenticates by its
// TLS session's client certificate alone, mapped by a cert= line as on the
// other listeners (docs/security.md, "Client certificates").

var errNoClientCert = errors.New("no verified client certificate: with --auth-token-file this listener " +
	"takes a client certificate that a cert= line of the token file maps (it carries no bearer token)")

// WithClientCert returns ctx carrying the identity of the verified client
// certificate of the TLS session st, for Authorize and Allows. It fails,
// with a message for the client, when st is nil, holds no verified
// certificate, or no cert= line names it. A nil Tokens (no
// --auth-token-file) returns ctx as it is.
func (a *Tokens) WithClientCert(ctx context.Context, st *tls.ConnectionState) (context.Context, error) {
	if a == nil {
		return ctx, nil
	}
	if st == nil || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return nil, errNoClientCert
	}
	id, err := a.checkOrCert(nil, certIdentity(st.VerifiedChains[0][0]))
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, identityKey{}, id), nil
}

// Package auth decides who may call the daemon and on which files: the
// bearer tokens and client-certificate identities of --auth-token-file
// with their scopes (Tokens, reloaded on SIGHUP), the checks at a gRPC
// call's headers (the tap), in front of the HTTP listener (the
// middleware) and on each request's paths (Authorize), the server's TLS,
// and the guard that closes a connection which does not authenticate in
// time (GuardedListener). It knows nothing of the FileService's handlers
// or the gateway: they call it.
//
// Lock order:
//
//	Tokens.reloadMu   (serialises token reloads; held across the read of
//	                  the token file and the AfterReload functions, which
//	                  take their doors' own locks under it: the NBD
//	                  server's connection set, then each connection's)
//
// Checks take no lock: the credentials in force are swapped whole by a
// reload (Tokens.creds).
package auth

package main

import (
	"flag"

	"github.com/filewrite/filewrite/service"
)

// registerReliabilityFlags binds the flags of authentication, TLS and the
// resource limits (README: "Guarantees and limits").
func registerReliabilityFlags(fs *flag.FlagSet, cfg *service.Config) {
	fs.StringVar(&cfg.AuthTokenFile, "auth-token-file", cfg.AuthTokenFile,
		"`file` of bearer tokens, one per line, reread on SIGHUP; every RPC but health then needs one")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate `file`: both listeners serve TLS (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM private key `file` of --tls-cert")
	fs.BoolVar(&cfg.InsecureListen, "insecure-listen", cfg.InsecureListen,
		"allow a listen address beyond loopback without --auth-token-file")
	fs.IntVar(&cfg.Store.MaxOpenFiles, "max-open-files", cfg.Store.MaxOpenFiles,
		"most files held open at once; idle ones are closed to make room, and past it a request is RESOURCE_EXHAUSTED")
	fs.IntVar(&cfg.Store.MaxWaitersPerFile, "max-waiters-per-file", cfg.Store.MaxWaitersPerFile,
		"most requests that may queue for one file's lock; past it a request is RESOURCE_EXHAUSTED (0: unbounded)")
}

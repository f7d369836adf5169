package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/filewrite/filewrite/service/internal/auth"
)

// setupSecurity loads the tokens and the certificate that cfg names and
// refuses to expose the daemon beyond loopback without tokens. Start calls
// it before anything listens or any file is opened.
func (s *Server) setupSecurity() error {
	cfg := s.cfg
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key must be given together")
	}
	exposed, err := exposedAddrs(cfg)
	if err != nil {
		return err
	}
	if len(exposed) > 0 && cfg.AuthTokenFile == "" && !cfg.InsecureListen {
		return fmt.Errorf("refusing to listen on %s: not a loopback address, and without --auth-token-file anyone "+
			"who can reach it may read, overwrite and truncate every file below --root; give --auth-token-file "+
			"(with --tls-cert and --tls-key so tokens do not travel in clear), or --insecure-listen if every "+
			"host that can reach it is trusted", strings.Join(exposed, " and "))
	}
	if cfg.TLSClientCA != "" && (cfg.TLSCert == "" || cfg.AuthTokenFile == "") {
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key (client certificates come with TLS) and --auth-token-file (its cert= lines map certificates to scopes)")
	}
	if cfg.NBDAddr != "" && cfg.AuthTokenFile != "" && cfg.TLSClientCA == "" {
		return errors.New("--nbd-addr with --auth-token-file needs --tls-client-ca (with --tls-cert and --tls-key): NBD carries " +
			"no bearer token, so a client certificate that a cert= line maps is its only credential; without tokens, serve " +
			"NBD on loopback or a unix socket")
	}
	if cfg.TLSCert != "" {
		if s.tlsConf, err = auth.ServerTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA); err != nil {
			return err
		}
	}
	if cfg.AuthTokenFile != "" {
		if s.auth, err = auth.NewTokens(cfg.AuthTokenFile, s.log); err != nil {
			return err
		}
	}
	switch {
	case len(exposed) > 0 && s.auth == nil:
		s.log.Warn("listening beyond loopback without authentication (--insecure-listen)", "addrs", exposed)
	case len(exposed) > 0 && s.tlsConf == nil:
		s.log.Warn("listening beyond loopback without TLS: bearer tokens and data travel in clear", "addrs", exposed)
	}
	s.log.Info("security", "auth", s.auth != nil, "tls", s.tlsConf != nil, "client_certs", cfg.TLSClientCA != "")
	return nil
}

// exposedAddrs lists the listen addresses of cfg that are not loopback
// only, each with its protocol.
func exposedAddrs(cfg Config) ([]string, error) {
	var out []string
	for _, l := range []struct{ proto, addr string }{{"gRPC", cfg.GRPCAddr}, {"HTTP", cfg.HTTPAddr}, {"NBD", cfg.NBDAddr}} {
		if l.addr == "" {
			continue
		}
		loop, err := isLoopbackAddr(l.addr)
		if err != nil {
			return nil, err
		}
		if !loop {
			out = append(out, fmt.Sprintf("%s (%s)", l.addr, l.proto))
		}
	}
	return out, nil
}

// isLoopbackAddr reports whether a listen address ("host:port", or
// "unix:PATH", which is local) binds to
// loopback only. An empty host binds every interface. A host name counts as
// loopback only when every address it resolves to is one ("localhost" is
// taken as loopback without asking, as RFC 6761 allows).
func isLoopbackAddr(addr string) (bool, error) {
	if strings.HasPrefix(addr, "unix:") {
		return true, nil // a unix socket: this machine only
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("listen address %q: %w", addr, err)
	}
	host, _, _ = strings.Cut(host, "%") // an IPv6 zone does not change the answer
	if host == "" {
		return false, nil
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback(), nil
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ips, err := net.DefaultResolver.LookupIPAddr(context.Background(), host)
	if err != nil {
		return false, fmt.Errorf("resolve listen address %q: %w", addr, err)
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false, nil
		}
	}
	return len(ips) > 0, nil
}

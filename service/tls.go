package service

import (
	"crypto/tls"
	"fmt"
	"net"
)

// serverTLS loads --tls-cert and --tls-key. Both listeners serve the same
// certificate.
func serverTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// httpTLSListener wraps the gateway's listener in TLS, offering HTTP/2
// (which net/http serves on a listener of *tls.Conn that negotiated it) and
// HTTP/1.1.
func httpTLSListener(lis net.Listener, conf *tls.Config) net.Listener {
	c := conf.Clone()
	c.NextProtos = []string{"h2", "http/1.1"}
	return tls.NewListener(lis, c)
}

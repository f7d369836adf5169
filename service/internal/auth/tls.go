package auth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
)

// ServerTLS loads --tls-cert and --tls-key, and --tls-client-ca when given
// (clientCA != ""). Both listeners serve the same certificate. With client
// CAs, a client may present a certificate, which must then verify against
// them (tls.VerifyClientCertIfGiven): a client with a bearer token and no
// certificate still gets in, so that tokens and certificates can be used
// side by side.
func ServerTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	conf := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("read --tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s holds no PEM certificate", clientCA)
		}
		conf.ClientCAs = pool
		conf.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return conf, nil
}

// HTTPTLSListener wraps the gateway's listener in TLS, offering HTTP/2
// (which net/http serves on a listener of *tls.Conn that negotiated it) and
// HTTP/1.1.
func HTTPTLSListener(lis net.Listener, conf *tls.Config) net.Listener {
	c := conf.Clone()
	c.NextProtos = []string{"h2", "http/1.1"}
	return tls.NewListener(lis, c)
}

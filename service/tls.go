package service

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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

// gatewayCredentials is how the gateway dials the daemon's own gRPC
// listener on loopback.
//
// With TLS on, the gateway speaks TLS too, rather than using an in-process
// connection: grpc-go has none besides test/bufconn, and a second,
// plaintext gRPC server for the gateway alone would be a second door to
// keep shut and to drain. The gateway cannot verify the certificate the
// usual way, because it dials a loopback address the certificate need not
// name and the issuing CA need not be in the system pool. It pins instead:
// it accepts exactly the certificate the daemon serves, byte for byte,
// which only the holder of --tls-key can present. That check is stricter
// than chain and name verification, which is why turning those off here
// is safe.
func gatewayCredentials(conf *tls.Config) credentials.TransportCredentials {
	if conf == nil {
		return insecure.NewCredentials()
	}
	leaf := conf.Certificates[0].Certificate[0]
	return credentials.NewTLS(&tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection's pin
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, leaf) {
				return errors.New("gateway: the gRPC listener did not present the daemon's own certificate")
			}
			return nil
		},
	})
}

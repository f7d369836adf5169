package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Exit codes of "filewrite probe": 0 the daemon serves, 1 it does not (or
// cannot be reached), 2 the probe's own flags are wrong.
const (
	probeServing    = 0
	probeNotServing = 1
	probeUsage      = 2
)

// probeConfig is what "filewrite probe" checks.
type probeConfig struct {
	grpcAddr, httpAddr string
	service            string
	timeout            time.Duration
	tlsCA              string
	tlsNoVerify        bool
}

// runProbe is "filewrite probe": one health check of a running daemon, for
// a container's healthcheck where the image has no shell and no curl. By
// default it asks the gRPC health service (open without a token, as is
// /readyz); with --http-addr it asks GET /readyz instead. It prints the
// answer and exits 0 when the daemon serves.
func runProbe(args []string, stdout, stderr io.Writer) int {
	pc, err := parseProbeFlags(args, stderr, os.LookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		return probeServing
	}
	if err != nil {
		fmt.Fprintln(stderr, "filewrite probe:", err)
		return probeUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), pc.timeout)
	defer cancel()
	answer, err := pc.check(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "filewrite probe:", err)
		return probeNotServing
	}
	fmt.Fprintln(stdout, answer)
	return probeServing
}

// parseProbeFlags reads the probe's flags. --grpc-addr defaults to the
// daemon's own FILEWRITE_GRPC_ADDR when that is set, so that a probe run
// inside the daemon's container needs no flags; a wildcard listen address
// (0.0.0.0:50051, :50051) is probed on loopback.
func parseProbeFlags(args []string, out io.Writer, lookup func(string) (string, bool)) (probeConfig, error) {
	pc := probeConfig{grpcAddr: "127.0.0.1:50051", timeout: 5 * time.Second}
	if v, ok := lookup(envName("grpc-addr")); ok && v != "" {
		pc.grpcAddr = v
	}
	fs := flag.NewFlagSet("filewrite probe", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&pc.grpcAddr, "grpc-addr", pc.grpcAddr, "the daemon's gRPC `address`, host:port or unix:PATH (default from "+envName("grpc-addr")+" when set)")
	fs.StringVar(&pc.httpAddr, "http-addr", "", "probe GET /readyz at this host:port instead of gRPC health")
	fs.StringVar(&pc.service, "service", "", "gRPC health `service` to ask about (\"\": the daemon as a whole; filewrite.v1.FileService)")
	fs.DurationVar(&pc.timeout, "timeout", pc.timeout, "give up after this long")
	fs.StringVar(&pc.tlsCA, "tls-ca", "", "speak TLS, trusting the PEM certificates in this `file` (the daemon's own certificate, if self-signed)")
	fs.BoolVar(&pc.tlsNoVerify, "tls-no-verify", false, "speak TLS without verifying the daemon's certificate (enough for a probe over loopback)")
	if err := fs.Parse(args); err != nil {
		return pc, err
	}
	if fs.NArg() > 0 {
		return pc, fmt.Errorf("unexpected arguments %q: the probe takes flags only", fs.Args())
	}
	if pc.timeout <= 0 {
		return pc, fmt.Errorf("--timeout %v: want more than 0", pc.timeout)
	}
	return pc, nil
}

// tlsConfig is the probe's TLS client configuration, nil without TLS.
func (pc probeConfig) tlsConfig() (*tls.Config, error) {
	if pc.tlsCA == "" && !pc.tlsNoVerify {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: pc.tlsNoVerify}
	if pc.tlsCA != "" {
		pem, err := os.ReadFile(pc.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", pc.tlsCA)
		}
	}
	return conf, nil
}

// check asks the daemon once and returns its answer, or why it does not
// serve.
func (pc probeConfig) check(ctx context.Context) (string, error) {
	tlsConf, err := pc.tlsConfig()
	if err != nil {
		return "", err
	}
	if pc.httpAddr != "" {
		return pc.checkHTTP(ctx, tlsConf)
	}
	return pc.checkGRPC(ctx, tlsConf)
}

func (pc probeConfig) checkGRPC(ctx context.Context, tlsConf *tls.Config) (string, error) {
	creds := insecure.NewCredentials()
	if tlsConf != nil {
		creds = credentials.NewTLS(tlsConf)
	}
	target := loopbackFor(pc.grpcAddr)
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return "", fmt.Errorf("gRPC %s: %w", target, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: pc.service})
	if err != nil {
		return "", fmt.Errorf("gRPC health of %s at %s: %w", pc.serviceName(), target, err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return "", fmt.Errorf("gRPC health of %s at %s: %v", pc.serviceName(), target, st)
	}
	return fmt.Sprintf("%s at %s: SERVING", pc.serviceName(), target), nil
}

func (pc probeConfig) serviceName() string {
	if pc.service == "" {
		return "the daemon"
	}
	return pc.service
}

func (pc probeConfig) checkHTTP(ctx context.Context, tlsConf *tls.Config) (string, error) {
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
	}
	url := scheme + "://" + loopbackFor(pc.httpAddr) + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	answer := fmt.Sprintf("GET %s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
	if resp.StatusCode/100 != 2 {
		return "", errors.New(answer)
	}
	return answer, nil
}

// loopbackFor turns a listen address into one to dial: a wildcard host
// (0.0.0.0, ::, none) becomes loopback, as a probe runs beside the daemon.
// unix:PATH and named hosts are kept.
func loopbackFor(addr string) string {
	if strings.HasPrefix(addr, "unix:") {
		return addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

package service

import (
	"fmt"
	"net/http"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/service/internal/auth"
	"github.com/filewrite/filewrite/service/internal/nbd"
	"github.com/filewrite/filewrite/service/internal/origin"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

// httpHandler serves the HTTP address: GET /metrics (Prometheus), GET
// /debug/locks, GET /debug/nbd, and everything else to the REST gateway. It dispatches on
// the exact path rather than through http.ServeMux, which would clean and
// redirect the gateway's paths ("a//b", "..") before the store could
// reject them.
//
// A REST call gets an HTTP server span (telemetry.httpServerHandler), which
// continues its caller's trace (the request's traceparent, tracestate,
// baggage, or what OTEL_PROPAGATORS names) and is the parent of the
// gateway's gRPC client span, whose context reaches the server in the
// call's metadata. grpc-gateway itself forwards none of these headers.
// browser, if not nil, checks every request but those for /metrics; tel
// serves /metrics and traces, st is the store /debug/locks reports on and
// traceURL where it links trace ids (--trace-url-template, "" for no
// links), and nbdSrv the NBD server /debug/nbd reports on (nil: none),
// asked at each request: it starts after the gateway. httpDoor is the
// door that serves a path beside the gateway (tus, WebDAV: doors.go), nil
// for the gateway's.
func httpHandler(gateway http.Handler, browser *origin.BrowserGuard, tel *telemetry, st *store.Store, traceURL string, nbdSrv func() *nbd.Server, httpDoor func(path string) http.Handler) http.Handler {
	locks := &debugLocks{store: st, traceURL: traceURL}
	gateway = tel.httpServerHandler(gateway)
	doors := tel.httpServerHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpDoor(r.URL.Path).ServeHTTP(w, r)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" && browser != nil {
			// Scrapers name the daemon by pod IP or service name.
			if err := browser.Check(r); err != nil {
				status.WriteHTTP(w, http.StatusForbidden, grpcstatus.Convert(err))
				return
			}
		}
		var h http.Handler
		switch r.URL.Path {
		case "/metrics":
			h = tel.metrics
		case "/debug/locks":
			h = locks
		case "/debug/nbd":
			h = &debugNBD{srv: nbdSrv()}
		default:
			if httpDoor(r.URL.Path) != nil {
				doors.ServeHTTP(w, r)
				return
			}
			gateway.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			getOnly(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// probeRoutes serves /healthz and /readyz in front of next, without a
// token, without the in-flight budget and without the browser checks:
// orchestrators probe by pod IP or service name and carry no credential.
//
//   - /healthz answers 200 while the process serves HTTP at all;
//   - /readyz answers 200 while health is SERVING, and 503 once the daemon
//     drains (Shutdown turns health NOT_SERVING first).
//
// They tell what gRPC's health service tells, which stays open too.
// grpc-gateway's WithHealthzEndpoint would serve them through the gateway,
// behind the token check, the budget and a gRPC call. tokens says whether
// the daemon checks tokens (AuthTokenFile).
func probeRoutes(next http.Handler, hs *health.Server, tokens bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if !tokens {
			auth.TrustConn(r.Context()) // without tokens every request vouches, as in auth.HTTPMiddleware
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			getOnly(w, r)
			return
		}
		state := healthpb.HealthCheckResponse_SERVING
		if r.URL.Path == "/readyz" {
			resp, err := hs.Check(r.Context(), &healthpb.HealthCheckRequest{})
			state = resp.GetStatus()
			if err != nil {
				state = healthpb.HealthCheckResponse_NOT_SERVING
			}
		}
		code := http.StatusOK
		if state != healthpb.HealthCheckResponse_SERVING {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		fmt.Fprintf(w, "{\"status\":%q}\n", state.String())
	})
}

// browserGuardFor is the guard that cfg needs, nil for none. Bearer tokens
// need none: a browser never attaches one on its own. A client certificate
// (--tls-client-ca) it does attach, to any request a page makes, so with
// one the Origin check stays; the Host check does not, as TLS already
// binds the name: a rebound name fails the certificate's.
func browserGuardFor(cfg Config, tokens bool) (*origin.BrowserGuard, error) {
	switch {
	case cfg.TLSClientCA != "":
		return origin.NewBrowserGuard(cfg.HTTPAddr, cfg.HTTPAllowedOrigins, []string{"*"})
	case tokens:
		return nil, nil
	}
	return origin.NewBrowserGuard(cfg.HTTPAddr, cfg.HTTPAllowedOrigins, cfg.HTTPAllowedHosts)
}

// getOnly answers a request on a route of GET and HEAD alone with any other
// method: 405, as the gateway answers one.
func getOnly(w http.ResponseWriter, r *http.Request) {
	const allow = "GET, HEAD"
	w.Header().Set("Allow", allow)
	status.WriteHTTP(w, http.StatusMethodNotAllowed, grpcstatus.Convert(status.MethodNotAllowed(r.Method, allow)))
}

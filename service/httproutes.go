package service

import (
	"net/http"
)

// httpHandler serves the HTTP address: GET /metrics (Prometheus), GET
// /debug/locks, and everything else to the REST gateway. It dispatches on
// the exact path rather than through http.ServeMux, which would clean and
// redirect the gateway's paths ("a//b", "..") before the store could
// reject them.
//
// A REST call gets an HTTP server span (telemetry.httpServerHandler), which
// continues its caller's trace (the request's traceparent, tracestate,
// baggage, or what OTEL_PROPAGATORS names) and is the parent of the
// gateway's gRPC client span, whose context reaches the server in the
// call's metadata. grpc-gateway itself forwards none of these headers.
func (s *Server) httpHandler(gateway http.Handler) http.Handler {
	locks := &debugLocks{store: s.store}
	gateway = s.tel.httpServerHandler(gateway)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h http.Handler
		switch r.URL.Path {
		case "/metrics":
			h = s.tel.metrics
		case "/debug/locks":
			h = locks
		default:
			gateway.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, r.Method+" not allowed: GET "+r.URL.Path, http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

package service

import (
	"net/http"

	"go.opentelemetry.io/otel/propagation"
)

// httpHandler serves the HTTP address: GET /metrics (Prometheus), GET
// /debug/locks, and everything else to the REST gateway. It dispatches on
// the exact path rather than through http.ServeMux, which would clean and
// redirect the gateway's paths ("a//b", "..") before the store could
// reject them.
//
// A REST call continues its caller's trace: the W3C trace context of the
// request's headers (traceparent, tracestate, baggage) becomes the parent of
// the gateway's gRPC client span, whose context reaches the server in the
// call's metadata. grpc-gateway itself forwards none of these headers.
func (s *Server) httpHandler(gateway http.Handler) http.Handler {
	locks := &debugLocks{store: s.store}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h http.Handler
		switch r.URL.Path {
		case "/metrics":
			h = s.tel.metrics
		case "/debug/locks":
			h = locks
		default:
			ctx := s.tel.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			gateway.ServeHTTP(w, r.WithContext(ctx))
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

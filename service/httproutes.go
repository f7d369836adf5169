package service

import "net/http"

// httpHandler serves the HTTP address: GET /metrics (Prometheus), GET
// /debug/locks, and everything else to the REST gateway. It dispatches on
// the exact path rather than through http.ServeMux, which would clean and
// redirect the gateway's paths ("a//b", "..") before the store could
// reject them.
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

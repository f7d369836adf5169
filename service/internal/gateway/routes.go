package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/status"
)

// routeTable answers which methods the gateway serves at a path, for the
// Allow header of a 405, and whether the path names a verb route. It is a
// ServeMux with every route the gateway registers whose handlers are never
// run: a middleware notes the match and stops. So the answer comes from
// the same patterns and the same matching as the routing itself, and
// cannot drift from it.
type routeTable struct {
	mux *runtime.ServeMux
}

// routeMatch is what the routeTable's middleware notes of a match: that
// there was one, and the verb of the pattern that matched ("" for none).
type routeMatch struct {
	ok   bool
	verb string
}

// routeMatchKey is where a probe's context carries its routeMatch.
type routeMatchKey struct{}

func newRouteTable(ctx context.Context) (*routeTable, error) {
	note := func(runtime.HandlerFunc) runtime.HandlerFunc {
		return func(_ http.ResponseWriter, r *http.Request, _ map[string]string) {
			m := r.Context().Value(routeMatchKey{}).(*routeMatch)
			m.ok = true
			if p, ok := runtime.HTTPPattern(r.Context()); ok {
				m.verb = p.Verb()
			}
		}
	}
	mux := runtime.NewServeMux(runtime.WithMiddlewares(note), runtime.WithDisablePathLengthFallback())
	// The client is never called: the middleware runs instead.
	if err := filewritev1.RegisterFileServiceHandlerClient(ctx, mux, nil); err != nil {
		return nil, fmt.Errorf("route table: %w", err)
	}
	if err := mux.HandlePath(http.MethodPut, "/v1/files/{path=**}", nil); err != nil {
		return nil, fmt.Errorf("route table: %w", err)
	}
	return &routeTable{mux: mux}, nil
}

// routeMethods are the methods the gateway's routes take, in the order
// Allow lists them (HEAD goes wherever GET does).
var routeMethods = []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete}

// probe reports which route r's path would take under method.
func (t *routeTable) probe(r *http.Request, method string) routeMatch {
	var m routeMatch
	// The mux looks at the method and the URL alone (path-length fallback
	// off): no need to copy the rest of r.
	probe := (&http.Request{Method: method, URL: r.URL, Header: http.Header{}, Body: http.NoBody}).
		WithContext(context.WithValue(context.Background(), routeMatchKey{}, &m))
	t.mux.ServeHTTP(discardResponse{}, probe)
	return m
}

// allow lists the methods served at r's path, HEAD wherever GET is. A path
// that ends in a verb that some route takes (":read", ":truncate") names
// that verb's route whatever the method (verb true), so only the verb's
// methods are listed; else every method that a route takes there.
func (t *routeTable) allow(r *http.Request) (allow string, verb bool) {
	var all, verbs []string
	for _, m := range routeMethods {
		match := t.probe(r, m)
		if !match.ok {
			continue
		}
		add := []string{m}
		if m == http.MethodGet {
			add = append(add, http.MethodHead)
		}
		all = append(all, add...)
		if match.verb != "" {
			verbs = append(verbs, add...)
		}
	}
	if verbs != nil {
		return strings.Join(verbs, ", "), true
	}
	return strings.Join(all, ", "), false
}

// wrongVerbMethod reports whether r names a verb route with a method that
// the verb does not take (GET x:truncate, PUT x:write, POST x:read), with
// the verb's methods for Allow. grpc-gateway would route such a request
// by the whole last segment, as one on a file named "x:truncate": a Stat's
// 404, or a raw PUT that creates it. A request on its verb's method costs
// one probe, and one whose last segment has no colon none.
func (t *routeTable) wrongVerbMethod(r *http.Request) (allow string, wrong bool) {
	path := r.URL.EscapedPath()
	last := path[strings.LastIndexByte(path, '/')+1:]
	if !strings.Contains(last, ":") && !strings.Contains(last, "%3A") && !strings.Contains(last, "%3a") {
		return "", false
	}
	if t.probe(r, r.Method).verb != "" {
		return "", false
	}
	return t.allow(r)
}

// discardResponse is where the routeTable's unmatched requests answer.
type discardResponse struct{}

func (discardResponse) Header() http.Header         { return http.Header{} }
func (discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (discardResponse) WriteHeader(int)             {}

// handleRoutingError answers a request that no route takes: 404
// (ROUTE_NOT_FOUND) for a path that none serves, and for a method that
// none at its path serves, 405 (METHOD_NOT_ALLOWED) with the Allow header
// that RFC 9110 asks for (grpc-gateway's own handler answers 501 without
// one, and neither with a reason).
func (g *gateway) handleRoutingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, code int) {
	switch code {
	case http.StatusMethodNotAllowed:
		allow, _ := g.routes.allow(r)
		g.methodNotAllowed(w, r, allow)
	case http.StatusNotFound:
		runtime.HTTPError(ctx, mux, m, w, r, &runtime.HTTPStatusError{
			HTTPStatus: http.StatusNotFound,
			Err:        status.RouteNotFound(requestMethod(r), r.URL.Path),
		})
	default:
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, code)
	}
}

// methodNotAllowed answers 405 with allow, the methods r's path takes.
func (g *gateway) methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	_, out := runtime.MarshalerForRequest(g.mux, r)
	runtime.HTTPError(r.Context(), g.mux, out, w, r, &runtime.HTTPStatusError{
		HTTPStatus: http.StatusMethodNotAllowed,
		Err:        status.MethodNotAllowed(requestMethod(r), allow),
	})
}

// requestMethod is r's method as its client sent it: HEAD is served as a
// GET (serveHTTP).
func requestMethod(r *http.Request) string {
	if isHead(r.Context()) {
		return http.MethodHead
	}
	return r.Method
}

package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// routeTable answers which methods the gateway serves at a path, for the
// Allow header of a 405. It is a ServeMux with every route the gateway
// registers whose handlers are never run: a middleware notes the match and
// stops. So the answer comes from the same patterns and the same matching
// as the routing itself, and cannot drift from it.
type routeTable struct {
	mux *runtime.ServeMux
}

// routeMatched is where the routeTable's middleware notes a match.
type routeMatched struct{}

func newRouteTable(ctx context.Context) (*routeTable, error) {
	note := func(runtime.HandlerFunc) runtime.HandlerFunc {
		return func(_ http.ResponseWriter, r *http.Request, _ map[string]string) {
			*r.Context().Value(routeMatched{}).(*bool) = true
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

// allow lists the methods served at r's path, HEAD wherever GET is.
func (t *routeTable) allow(r *http.Request) string {
	var methods []string
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete} {
		matched := false
		probe := r.Clone(context.WithValue(context.Background(), routeMatched{}, &matched))
		probe.Method = m
		probe.Body = http.NoBody
		t.mux.ServeHTTP(discardResponse{}, probe)
		if matched {
			methods = append(methods, m)
			if m == http.MethodGet {
				methods = append(methods, http.MethodHead)
			}
		}
	}
	return strings.Join(methods, ", ")
}

// discardResponse is where the routeTable's unmatched requests answer.
type discardResponse struct{}

func (discardResponse) Header() http.Header         { return http.Header{} }
func (discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (discardResponse) WriteHeader(int)             {}

// handleRoutingError answers a request that no route takes: 404 for a
// path that none serves, and for a method that none at its path serves,
// 405 with the Allow header that RFC 9110 asks for (grpc-gateway's own
// handler answers 501 without one).
func (g *gateway) handleRoutingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, code int) {
	if code != http.StatusMethodNotAllowed {
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, code)
		return
	}
	allow := g.routes.allow(r)
	w.Header().Set("Allow", allow)
	runtime.HTTPError(ctx, mux, m, w, r, &runtime.HTTPStatusError{
		HTTPStatus: http.StatusMethodNotAllowed,
		Err:        status.Errorf(codes.Unimplemented, "method %s not allowed here: this path takes %s", r.Method, allow),
	})
}

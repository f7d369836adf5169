package status

import (
	"net/http"

	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// WriteHTTP answers st as the gateway answers a status, with code: a
// JSON google.rpc.Status.
func WriteHTTP(w http.ResponseWriter, code int, st *grpcstatus.Status) {
	body := JSON(st)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	// Every caller refuses a request before reading its body: without
	// this, Go's server would wait for a stalled body to end before it
	// sent the answer, and the refused client would see nothing.
	h.Set("Connection", "close")
	w.WriteHeader(code)
	w.Write(body)
}

// MethodNotAllowed is the refusal of a request whose path is served, but
// not on method: allow lists the methods it takes, as the 405's Allow
// header does (which the caller sets).
func MethodNotAllowed(method, allow string) error {
	return Refusal(filewritev1.ErrorReason_METHOD_NOT_ALLOWED, map[string]string{"allow": allow},
		"method %s not allowed here: this path takes %s", method, allow)
}

// RouteNotFound is the refusal of a request whose path no route serves.
func RouteNotFound(method, path string) error {
	return Refusal(filewritev1.ErrorReason_ROUTE_NOT_FOUND, nil,
		"no route serves %s %s: files are under /v1/files/, directories under /v1/dirs, tus uploads under /v1/uploads/, WebDAV under /dav/ (docs/http.md)", method, path)
}

// JSON is st as the gateway writes it in an error's body: a JSON
// google.rpc.Status, its ErrorInfo among the details.
func JSON(st *grpcstatus.Status) []byte {
	body, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(st.Proto())
	if err != nil {
		return []byte(`{"code":2,"message":"unknown","details":[]}`)
	}
	return body
}

package status

import (
	"net/http"

	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
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

// JSON is st as the gateway writes it in an error's body: a JSON
// google.rpc.Status, its ErrorInfo among the details.
func JSON(st *grpcstatus.Status) []byte {
	body, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(st.Proto())
	if err != nil {
		return []byte(`{"code":2,"message":"unknown","details":[]}`)
	}
	return body
}

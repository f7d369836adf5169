package testutil

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// HTTPResult is an HTTP response read whole.
type HTTPResult struct {
	Status      int
	ContentType string
	Header      http.Header
	Body        []byte
}

// DoHTTP sends a request with the given headers and reads the whole
// response; a request that cannot be sent or read fails t.
func DoHTTP(t testing.TB, method, url string, body io.Reader, header map[string]string) HTTPResult {
	t.Helper()
	resp, b := SendHTTP(t, method, url, "", body, header)
	return HTTPResult{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Header: resp.Header, Body: b}
}

// SendHTTP is DoHTTP with the request's Host set to host (if not empty),
// answering the response itself (its body already read and closed) for
// what HTTPResult leaves out, such as ContentLength.
func SendHTTP(t testing.TB, method, url, host string, body io.Reader, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, b
}

// ErrorBody is grpc-gateway's JSON error: a google.rpc.Status.
type ErrorBody struct {
	Code    codes.Code `json:"code"`
	Message string     `json:"message"`
}

// ParseErrorBody decodes r's body as a JSON google.rpc.Status, and fails
// t unless it is one served as application/json.
func ParseErrorBody(t testing.TB, r HTTPResult) ErrorBody {
	t.Helper()
	var e ErrorBody
	if err := json.Unmarshal(r.Body, &e); err != nil {
		t.Fatalf("error body %q (Content-Type %q) is not JSON: %v", r.Body, r.ContentType, err)
	}
	if !strings.HasPrefix(r.ContentType, "application/json") {
		t.Errorf("error Content-Type = %q, want application/json", r.ContentType)
	}
	return e
}

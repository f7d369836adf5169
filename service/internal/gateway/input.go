package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/errorinfo"
	"github.com/filewrite/filewrite/service/internal/status"
)

// What the gateway accepts from a request besides its path: everything that
// is not understood is refused, never dropped. A dropped "ofset=16" writes
// at offset 0, a dropped "snyc=full" skips the sync the caller asked for.

// strictJSON decodes a request body as exactly one JSON value.
// grpc-gateway's decoder reads the first value and ignores the rest, so
// `{...}{"sync":"BOGUS"}` would be accepted; here anything but whitespace
// after the value is an error (a 400, like any body that does not decode).
type strictJSON struct {
	*runtime.HTTPBodyMarshaler
}

func (m strictJSON) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		d := json.NewDecoder(r)
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return err // io.EOF for an empty body, which the routes allow
		}
		switch tok, err := d.Token(); {
		case errors.Is(err, io.EOF):
		case err != nil:
			return fmt.Errorf("after the JSON object: %w", err)
		default:
			return fmt.Errorf("after the JSON object: unexpected %v; send one object per request", tok)
		}
		if msg, ok := v.(proto.Message); ok {
			// Straight to protojson: the marshaler's Unmarshal would copy
			// the body once more on its way.
			return jsonPb.UnmarshalOptions.Unmarshal(raw, msg)
		}
		return m.Unmarshal(raw, v)
	})
}

// strictQuery is the query-parameter parser of the JSON routes: a
// parameter must name a field of the request that the URL path does not
// already give, once (grpc-gateway's own parser, which does the parsing,
// refuses a second value). That parser skips unknown names.
type strictQuery struct{ runtime.DefaultQueryParser }

// useStrictQuery installs strictQuery. grpc-gateway keeps the parser in a
// package variable, which its ServeMux option assigns: assigned once here,
// before any gateway serves, so that two gateways started at once (tests)
// do not race on it.
var useStrictQuery = sync.OnceValue(func() runtime.ServeMuxOption {
	runtime.SetQueryParameterParser(&strictQuery{})(nil)
	return func(*runtime.ServeMux) {}
})

func (q *strictQuery) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	fields := msg.ProtoReflect().Descriptor().Fields()
	for key, vals := range values {
		for _, v := range vals {
			if !utf8.ValidString(v) {
				return fmt.Errorf("query parameter %q: %q is not valid UTF-8", key, v)
			}
		}
		fd := fields.ByTextName(key)
		if fd == nil {
			fd = fields.ByJSONName(key)
		}
		switch {
		case fd == nil:
			return fmt.Errorf("unknown query parameter %q: this route takes %s", key, queryFields(fields, filter))
		case inPath(filter, fd.Name()):
			return fmt.Errorf("query parameter %q: the URL path gives it", key)
		}
	}
	return q.DefaultQueryParser.Parse(msg, values, filter)
}

// inPath reports whether the route's URL path binds the field.
func inPath(filter *utilities.DoubleArray, name protoreflect.Name) bool {
	return filter != nil && filter.HasCommonPrefix([]string{string(name)})
}

// queryFields lists the names a route takes in its query.
func queryFields(fields protoreflect.FieldDescriptors, filter *utilities.DoubleArray) string {
	var names []string
	for i := range fields.Len() {
		if name := fields.Get(i).Name(); !inPath(filter, name) {
			names = append(names, string(name))
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// rawQueryValues parses the query of a raw route (PUT, a raw append),
// which takes the keys given, each at most once and not empty, and
// returns their values. Anything else is refused, as the JSON routes
// refuse unknown fields; takes says what the route takes, in the refusal
// of an unknown key.
func rawQueryValues(rawQuery, takes string, keys ...string) (map[string]string, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, nil, "query %q: %v", rawQuery, err)
	}
	values := make(map[string]string, len(q))
	for _, key := range slices.Sorted(maps.Keys(q)) {
		vals := q[key]
		switch {
		case !slices.Contains(keys, key):
			return nil, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: key}, "unknown query parameter %q: %s", key, takes)
		case len(vals) > 1:
			return nil, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: key}, "query parameter %q given %d times", key, len(vals))
		case vals[0] == "":
			return nil, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: key}, "query parameter %q is empty", key)
		}
		values[key] = vals[0]
	}
	return values, nil
}

// putQuery is the query of the raw PUT.
type putQuery struct {
	offset      int64 // default 0
	offsetGiven bool
	sync        filewritev1.SyncMode // default none
}

// rawWriteQuery parses the query of the raw PUT: offset and sync.
func rawWriteQuery(rawQuery string) (putQuery, error) {
	var pq putQuery
	q, err := rawQueryValues(rawQuery, "PUT takes offset and sync", "offset", "sync")
	if err != nil {
		return pq, err
	}
	if s, ok := q["offset"]; ok {
		pq.offsetGiven = true
		if pq.offset, err = strconv.ParseInt(s, 10, 64); err != nil {
			return pq, status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "offset"}, "offset %q is not an int64", s)
		}
	}
	if s, ok := q["sync"]; ok {
		if pq.sync, err = parseRawSync(s); err != nil {
			return pq, err
		}
	}
	return pq, nil
}

// checkContentType is the media-type rule of the routes: a POST route
// takes a JSON body and must be told so (Content-Type: application/json),
// even with no body. A form or text/plain body, or a POST without a type,
// is what a browser sends cross-site without asking first; refused with
// 415, such a request changes nothing. The raw PUT checks its own type
// (octet-stream or none: curl -T sends none, and no browser sends a PUT
// cross-site without asking).
func checkContentType(r *http.Request) error {
	if r.Method != http.MethodPost || isRawAppend(r) {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return nil
	}
	msg := "POST routes take a JSON body sent with Content-Type: application/json"
	if ct == "" {
		msg += "; the request has none (with curl: -H 'Content-Type: application/json')"
	} else {
		msg += fmt.Sprintf(", not %q", ct)
	}
	return status.Refusal(filewritev1.ErrorReason_REQUEST_MALFORMED, map[string]string{errorinfo.KeyField: "Content-Type"}, "%s", msg)
}

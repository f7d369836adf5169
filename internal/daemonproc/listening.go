package daemonproc

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The daemon says where it listens in its log, one record per listener,
// once the socket is bound, so that a connection to the address logged
// succeeds (service.Start writes them). This
// is a contract, documented in the README ("The listening records"), for
// whoever starts the daemon on port 0 and must learn the port the kernel
// picked: the record's message is "listening", its "protocol" attribute is
// "grpc" or "http", and its "addr" attribute is the address bound: host:port
// for TCP, the socket's path for unix:PATH. In the text format (the
// default) that is
//
//	time=... level=INFO msg=listening protocol=grpc addr=127.0.0.1:41234
//
// and in the JSON format (--log-format json)
//
//	{"time":"...","level":"INFO","msg":"listening","protocol":"grpc","addr":"127.0.0.1:41234"}
//
// The gRPC record comes first; the HTTP one follows unless --http-addr is
// empty.

// Listener is one listening record of the daemon's log.
type Listener struct {
	Protocol string // "grpc" or "http"
	Addr     string // as the daemon bound it
}

// ParseListening reads one line of the daemon's log, in either format, and
// reports whether it is a listening record, and which.
func ParseListening(line string) (Listener, bool) {
	var rec struct{ Msg, Protocol, Addr string }
	if strings.HasPrefix(line, "{") {
		if json.Unmarshal([]byte(line), &rec) != nil {
			return Listener{}, false
		}
	} else {
		attrs := textAttrs(line)
		rec.Msg, rec.Protocol, rec.Addr = attrs["msg"], attrs["protocol"], attrs["addr"]
	}
	if rec.Msg != "listening" || (rec.Protocol != "grpc" && rec.Protocol != "http") || rec.Addr == "" {
		return Listener{}, false
	}
	return Listener{Protocol: rec.Protocol, Addr: rec.Addr}, true
}

// textAttrs splits a line of slog's text format into its key=value pairs.
// A value that slog quoted (one with a space, a quote or an '=', say) is
// unquoted; nil if the line is not in that format.
func textAttrs(line string) map[string]string {
	attrs := map[string]string{}
	for rest := strings.TrimLeft(line, " "); rest != ""; rest = strings.TrimLeft(rest, " ") {
		key, after, ok := strings.Cut(rest, "=")
		if !ok || key == "" || strings.Contains(key, " ") {
			return nil
		}
		var val string
		if strings.HasPrefix(after, `"`) {
			quoted, err := strconv.QuotedPrefix(after)
			if err != nil {
				return nil
			}
			val, _ = strconv.Unquote(quoted)
			rest = after[len(quoted):]
		} else {
			val, rest, _ = strings.Cut(after, " ")
		}
		attrs[key] = val
	}
	return attrs
}

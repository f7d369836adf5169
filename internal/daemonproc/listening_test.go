package daemonproc

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestParseListening: the listening records, as slog writes them in both
// formats (addresses that need quoting included), parse; other lines do
// not.
func TestParseListening(t *testing.T) {
	records := []Listener{
		{"grpc", "127.0.0.1:41234"},
		{"http", "[::1]:8080"},
		{"grpc", "/run/filewrite/grpc.sock"},
		{"grpc", `/tmp/a dir/with "quotes"=.sock`},
	}
	for _, format := range []string{"text", "json"} {
		for _, want := range records {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			if format == "json" {
				log = slog.New(slog.NewJSONHandler(&buf, nil))
			}
			log.Info("listening", "protocol", want.Protocol, "addr", want.Addr)
			line := strings.TrimSuffix(buf.String(), "\n")
			got, ok := ParseListening(line)
			if !ok || got != want {
				t.Errorf("%s: ParseListening(%q) = %+v, %v; want %+v, true", format, line, got, ok, want)
			}
		}
	}

	for _, line := range []string{
		"",
		"time=2025-01-01T00:00:00Z level=INFO msg=\"filewrite started\" root=./data",
		"time=2025-01-01T00:00:00Z level=INFO msg=listening protocol=smtp addr=127.0.0.1:25",
		"time=2025-01-01T00:00:00Z level=INFO msg=listening protocol=grpc",
		"time=2025-01-01T00:00:00Z level=INFO msg=started note=\"msg=listening protocol=grpc addr=1.2.3.4:5\"",
		`time=x level=INFO msg=listening protocol=grpc addr="unterminated`,
		`{"msg":"listening","protocol":"grpc"`,
		`{"msg":"started","protocol":"grpc","addr":"127.0.0.1:1"}`,
		"listening on 127.0.0.1:50051",
	} {
		if got, ok := ParseListening(line); ok {
			t.Errorf("ParseListening(%q) = %+v, true; want no record", line, got)
		}
	}
}

func TestWantsHTTP(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--http-addr", ""}, false},
		{[]string{"--http-addr="}, false},
		{[]string{"--http-addr", "", "--http-addr", "127.0.0.1:0"}, true},
		{[]string{"--http-addr=127.0.0.1:0", "--http-addr", ""}, false},
		{[]string{"--grpc-addr", "127.0.0.1:0"}, true},
	} {
		if got := wantsHTTP(tt.args); got != tt.want {
			t.Errorf("wantsHTTP(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}

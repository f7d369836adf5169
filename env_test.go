package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/service"
	"github.com/filewrite/filewrite/store"
)

// TestFlagsFromEnv: each flag's FILEWRITE_* variable sets it, the command
// line wins over the variable, an empty value is a value, and variables
// that name no flag are ignored.
func TestFlagsFromEnv(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		got  func(service.Config) any
		want any
	}{
		{"root", map[string]string{"FILEWRITE_ROOT": "/srv/env"}, nil,
			func(c service.Config) any { return c.Root }, "/srv/env"},
		{"command line wins", map[string]string{"FILEWRITE_ROOT": "/srv/env"}, []string{"--root", "/srv/flag"},
			func(c service.Config) any { return c.Root }, "/srv/flag"},
		{"empty value", map[string]string{"FILEWRITE_HTTP_ADDR": ""}, nil,
			func(c service.Config) any { return c.HTTPAddr }, ""},
		{"enum", map[string]string{"FILEWRITE_POLICY": "exclusive"}, nil,
			func(c service.Config) any { return c.Store.Policy }, store.PolicyExclusive},
		{"size", map[string]string{"FILEWRITE_MAX_REQUEST_BYTES": "4k"}, nil,
			func(c service.Config) any { return c.Store.MaxRequestBytes }, int64(4096)},
		{"duration", map[string]string{"FILEWRITE_DRAIN_TIMEOUT": "7s"}, nil,
			func(c service.Config) any { return c.DrainTimeout }, 7 * time.Second},
		{"shutdown delay", map[string]string{"FILEWRITE_SHUTDOWN_DELAY": "10s"}, nil,
			func(c service.Config) any { return c.ShutdownDelay }, 10 * time.Second},
		{"bool", map[string]string{"FILEWRITE_INSECURE_LISTEN": "true"}, nil,
			func(c service.Config) any { return c.InsecureListen }, true},
		{"unknown variables ignored", map[string]string{"FILEWRITE_NO_SUCH_FLAG": "x", "FILEWRITE_1_HTTP": "y"}, nil,
			func(c service.Config) any { return c.Root }, "./data"},
		// A variable counts as given when defaults are derived: the open
		// file bound given by its variable stays as given under --io=direct,
		// and --io given by its variable derives the bound for direct I/O.
		{"variable is given for derived defaults", map[string]string{"FILEWRITE_MAX_OPEN_FILES": "100"}, []string{"--io", "direct"},
			func(c service.Config) any { return c.Store.MaxOpenFiles }, 100},
		{"variable derives defaults", map[string]string{"FILEWRITE_IO": "direct"}, nil,
			func(c service.Config) any { return c.Store.MaxOpenFiles }, store.MaxOpenFilesFor(store.NoFileLimit(), store.IODirect)},
		// --version is not a setting: a variable left in an environment
		// must not turn every start into a version print.
		{"no FILEWRITE_VERSION", map[string]string{"FILEWRITE_VERSION": "true"}, nil,
			func(c service.Config) any { return c.Root }, "./data"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			cfg, err := parseFlags(tt.args, io.Discard)
			if err != nil {
				t.Fatalf("parseFlags(%q) with %v: %v", tt.args, tt.env, err)
			}
			if got := tt.got(cfg); got != tt.want {
				t.Errorf("parseFlags(%q) with %v: got %v, want %v", tt.args, tt.env, got, tt.want)
			}
		})
	}
}

// TestFlagsFromEnvRejects: a bad value in a variable is refused with an
// error that names the variable, as a bad flag names the flag; the same
// value on the command line is not looked at twice.
func TestFlagsFromEnvRejects(t *testing.T) {
	t.Setenv("FILEWRITE_MAX_FILE_SIZE", "0")
	_, err := parseFlags(nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "FILEWRITE_MAX_FILE_SIZE") {
		t.Errorf("FILEWRITE_MAX_FILE_SIZE=0: %v, want an error naming the variable", err)
	}
	if _, err := parseFlags([]string{"--max-file-size", "1g"}, io.Discard); err != nil {
		t.Errorf("--max-file-size 1g over FILEWRITE_MAX_FILE_SIZE=0: %v, want the command line to win", err)
	}
}

// TestEveryFlagDocumented: docs/operations.md lists every flag of the
// daemon with its variable, so that neither can be added unseen.
func TestEveryFlagDocumented(t *testing.T) {
	doc, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg := service.DefaultConfig()
	fs := flag.NewFlagSet("filewrite", flag.ContinueOnError)
	registerFlags(fs, &cfg)
	var missing []string
	fs.VisitAll(func(f *flag.Flag) {
		row := regexp.MustCompile("(?m)^\\| `--" + regexp.QuoteMeta(f.Name) + "` \\| `" + envName(f.Name) + "` \\|")
		if !row.Match(doc) {
			missing = append(missing, "--"+f.Name)
		}
	})
	if len(missing) > 0 {
		t.Errorf("docs/operations.md has no row \"| `--flag` | `FILEWRITE_FLAG` |\" for %v", missing)
	}
}

func TestEnvName(t *testing.T) {
	for _, tt := range []struct{ flag, want string }{
		{"root", "FILEWRITE_ROOT"},
		{"max-open-files", "FILEWRITE_MAX_OPEN_FILES"},
		{"http-allowed-origins", "FILEWRITE_HTTP_ALLOWED_ORIGINS"},
	} {
		if got := envName(tt.flag); got != tt.want {
			t.Errorf("envName(%q) = %q, want %q", tt.flag, got, tt.want)
		}
	}
}

// TestVersionFlag: --version asks for the version rather than a daemon,
// and the version names the Go toolchain.
func TestVersionFlag(t *testing.T) {
	if _, err := parseFlags([]string{"--version"}, io.Discard); !errors.Is(err, errVersion) {
		t.Errorf("--version: %v, want errVersion", err)
	}
	b := service.ReadBuildInfo()
	if b.Version == "" || b.Commit == "" || !strings.HasPrefix(b.GoVersion, "go") {
		t.Errorf("ReadBuildInfo() = %+v, want a version, a commit (or unknown) and a Go version", b)
	}
	if s := b.String(); !strings.Contains(s, b.GoVersion) || !slices.Contains(strings.Fields(s), "filewrite") {
		t.Errorf("version line %q does not name filewrite and %s", s, b.GoVersion)
	}
}

//go:build linux

package store

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestOptionsValidate: Validate refuses what Open cannot use, naming the
// field, and takes 0 for the default everywhere; Open refuses the same.
func TestOptionsValidate(t *testing.T) {
	for _, tt := range []struct {
		name   string
		opts   Options
		option string // the refused field, "" for none
	}{
		{"zero", Options{}, ""},
		{"defaults", DefaultOptions(), ""},
		{"features off", Options{ExtentCacheBytes: -1, MapFileBytes: -5}, ""},
		{"unknown policy", Options{Policy: 9}, "Policy"},
		{"unknown io mode", Options{IO: 7}, "IO"},
		{"unknown fsync mode", Options{Fsync: -1}, "Fsync"},
		{"unknown synced-write mode", Options{SyncedWrites: 9}, "SyncedWrites"},
		{"negative timer delay", Options{FsyncTimerDelay: -time.Millisecond}, "FsyncTimerDelay"},
		{"negative file size", Options{MaxFileSize: -1}, "MaxFileSize"},
		{"negative request size", Options{MaxRequestBytes: -1}, "MaxRequestBytes"},
		{"negative open files", Options{MaxOpenFiles: -1}, "MaxOpenFiles"},
		{"open files past the descriptors", Options{MaxOpenFiles: int(NoFileLimit())}, "MaxOpenFiles"},
		{"direct open files past the descriptors", Options{IO: IODirect, MaxOpenFiles: int(NoFileLimit()) / 2}, "MaxOpenFiles"},
		{"negative waiters", Options{MaxWaitersPerFile: -1}, "MaxWaitersPerFile"},
		{"negative append IDs", Options{AppendIDs: -1}, "AppendIDs"},
		{"negative append ID TTL", Options{AppendIDTTL: -time.Second}, "AppendIDTTL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			var oe *OptionError
			switch {
			case tt.option == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.option == "":
				return
			case !errors.As(err, &oe):
				t.Fatalf("Validate() = %v, want an *OptionError of %s", err, tt.option)
			}
			if got, want := oe.Option, tt.option; got != want {
				t.Errorf("refused option %s, want %s (%v)", got, want, err)
			}
			if !strings.Contains(err.Error(), tt.option) {
				t.Errorf("error %q does not name %s", err, tt.option)
			}
			fsys, err := OpenOSFS(testutil.Dir(t))
			if err != nil {
				t.Fatal(err)
			}
			defer fsys.Close()
			if s, err := Open(fsys, tt.opts); err == nil {
				s.Close()
				t.Errorf("Open succeeded with options Validate refuses")
			}
		})
	}
}

// TestDefaultOptions: DefaultOptions are what Open makes of a zero
// Options.
func TestDefaultOptions(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	got, want := s.Options(), DefaultOptions()
	if got != want {
		t.Errorf("Open(zero Options).Options() = %+v, want DefaultOptions() %+v", got, want)
	}
	if want.MaxFileSize != DefaultMaxFileSize || want.MaxRequestBytes != DefaultMaxRequestBytes || want.Policy != DefaultPolicy {
		t.Errorf("DefaultOptions() = %+v, want the Default constants", want)
	}
}

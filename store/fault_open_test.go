//go:build linux

package store_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/filewrite/filewrite/store"
	"github.com/filewrite/filewrite/store/faultfs"
)

// TestOutOfDescriptors: when opening a file fails for lack of descriptors
// (EMFILE: the process's RLIMIT_NOFILE; ENFILE: the system's table), every
// request that needs the file open is ErrNoDescriptors, the errno kept,
// with the limit and the path in the message, and creates nothing; a file
// already open is still served; once descriptors are back, so is the rest.
func TestOutOfDescriptors(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		errno syscall.Errno
		limit string // what the message must name
	}{
		{syscall.EMFILE, "RLIMIT_NOFILE"},
		{syscall.ENFILE, "fs.file-max"},
	} {
		t.Run(tt.errno.Error(), func(t *testing.T) {
			fs := newFaultStore(t, store.Options{})
			if _, err := fs.Write(ctx, "open.bin", 0, []byte("open"), store.SyncNone); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(fs.osPath("closed.bin"), []byte("closed"), 0o644); err != nil {
				t.Fatal(err)
			}
			out := fs.fsys.Inject(faultfs.Rule{Op: faultfs.OpOpen, Err: tt.errno})

			for _, op := range []struct {
				name, path string
				call       func(path string) error
			}{
				{"Write creating its directory", faultPath, func(p string) error {
					_, err := fs.Write(ctx, p, 0, []byte("x"), store.SyncNone)
					return err
				}},
				{"Read of a file not open", "closed.bin", func(p string) error {
					_, err := fs.Read(ctx, p, 0, 6)
					return err
				}},
				{"Truncate of a file not open", "closed.bin", func(p string) error {
					return fs.Truncate(ctx, p, 0)
				}},
			} {
				err := op.call(op.path)
				if !errors.Is(err, store.ErrNoDescriptors) || !errors.Is(err, tt.errno) {
					t.Errorf("%s: %v, want ErrNoDescriptors with %v", op.name, err, tt.errno)
					continue
				}
				for _, want := range []string{tt.limit, op.path} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s: %q does not name %q", op.name, err, want)
					}
				}
			}
			if _, err := os.Stat(fs.osPath("ckpt")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("ckpt/ after the refused Write: %v, want it not to exist", err)
			}
			if got := string(fs.content(t, "closed.bin")); got != "closed" {
				t.Errorf("closed.bin holds %q after the refused Truncate, want %q", got, "closed")
			}

			// The open file needs no descriptor more.
			if _, err := fs.Write(ctx, "open.bin", 4, []byte("!"), store.SyncData); err != nil {
				t.Errorf("Write to a file already open: %v", err)
			}

			out.Remove()
			if _, err := fs.Write(ctx, faultPath, 0, []byte("x"), store.SyncNone); err != nil {
				t.Errorf("Write once descriptors are back: %v", err)
			}
			if b, err := fs.Read(ctx, "closed.bin", 0, 6); err != nil || string(b) != "closed" {
				t.Errorf("Read once descriptors are back: %q, %v", b, err)
			}
		})
	}
}

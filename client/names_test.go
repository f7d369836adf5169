package client_test

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
)

// TestNames: the atomic publish of a file through the client (write a
// temporary file, sync it, rename it over the target with its directory
// synced, list), and the refusals of Delete, Rename and List.
func TestNames(t *testing.T) {
	d, ctx, c := startAndDial(t)
	write := func(path, data string) {
		t.Helper()
		f := openFile(t, ctx, c, path)
		if _, err := f.WriteAt([]byte(data), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("pub/model.bin", "old")
	write("pub/.model.bin.tmp", "new model")
	if err := c.Rename(ctx, "pub/.model.bin.tmp", "pub/model.bin", client.WithSyncDirs()); err != nil {
		t.Fatal(err)
	}
	if got := string(d.onDisk(t, "pub/model.bin")); got != "new model" {
		t.Errorf("published file holds %q", got)
	}
	if got, want := collect(t, c.List(ctx, "pub")), []client.DirEntry{{Name: "model.bin", Size: 9}}; !slices.Equal(got, want) {
		t.Errorf("List(pub) = %v, want %v", got, want)
	}

	for _, n := range []string{"e", "a", "d", "c", "b"} {
		write("many/"+n, n)
	}
	got := collect(t, c.List(ctx, "many", client.WithPageSize(2)))
	var names []string
	for _, e := range got {
		names = append(names, e.Name)
	}
	if want := []string{"a", "b", "c", "d", "e"}; !slices.Equal(names, want) {
		t.Errorf("List in pages of 2: %v, want %v", names, want)
	}
	for e, err := range c.List(ctx, "many", client.WithPageSize(2)) {
		if err != nil || e.Name != "a" {
			t.Errorf("first entry: %v, %v", e, err)
		}
		break // a loop may stop early
	}
	if got := collect(t, c.List(ctx, "")); len(got) != 2 || !got[0].IsDir || got[0].Name != "many" {
		t.Errorf("List of the root: %v, want many/ and pub/", got)
	}
	if err := c.SyncDir(ctx, "many"); err != nil {
		t.Errorf("SyncDir: %v", err)
	}

	for _, tt := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"rename without replacing", c.Rename(ctx, "many/a", "many/b", client.WithNoReplace()), codes.AlreadyExists},
		{"rename a missing file", c.Rename(ctx, "many/z", "many/y"), codes.NotFound},
		{"delete a directory", c.Delete(ctx, "many"), codes.InvalidArgument},
		{"delete", c.Delete(ctx, "many/a", client.WithSyncDirs()), codes.OK},
		{"delete again", c.Delete(ctx, "many/a"), codes.NotFound},
		{"list a missing directory", listErr(c.List(ctx, "nodir")), codes.NotFound},
		{"page size over the maximum", listErr(c.List(ctx, "many", client.WithPageSize(10001))), codes.InvalidArgument},
	} {
		if got := status.Code(tt.err); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, tt.want)
		}
	}
}

// TestOpenFileAcrossNames: a File writes on to its file after a Rename,
// under the new name, and fails with NOT_FOUND once the file is deleted,
// without making a new file.
func TestOpenFileAcrossNames(t *testing.T) {
	d, ctx, c := startAndDial(t)
	f := openFile(t, ctx, c, "open/a")
	defer f.Close()
	if _, err := f.WriteAt([]byte("before "), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, "open/a", "open/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("after"), 7); err != nil {
		t.Fatal(err)
	}
	if got := string(d.onDisk(t, "open/b")); got != "before after" {
		t.Errorf("open/b holds %q, want %q", got, "before after")
	}
	if err := c.Delete(ctx, "open/b"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		// The first may go on the stream the daemon is ending, or after
		// it ended; either way, and for those after, nothing may open a
		// new stream, which would create a new file under open/a.
		if _, err := f.WriteAt([]byte("lost"), 0); status.Code(err) != codes.NotFound {
			t.Errorf("WriteAt %d after Delete: %v, want NOT_FOUND", i, err)
		}
	}
	if got := collect(t, c.List(ctx, "open")); len(got) != 0 {
		t.Errorf("after the Delete, open/ holds %v, want nothing", got)
	}
}

func collect(t *testing.T, seq func(func(client.DirEntry, error) bool)) []client.DirEntry {
	t.Helper()
	var out []client.DirEntry
	for e, err := range seq {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// listErr is the error that ends a listing, if any.
func listErr(seq func(func(client.DirEntry, error) bool)) error {
	for _, err := range seq {
		if err != nil {
			return err
		}
	}
	return errors.New("the listing ended without an error")
}

//go:build linux

package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// listAll pages through dir and returns every entry and the number of pages.
func listAll(t *testing.T, s *Store, dir string, pageSize int) ([]DirEntry, int) {
	t.Helper()
	var all []DirEntry
	tok := ""
	for pages := 1; ; pages++ {
		entries, next, err := s.List(context.Background(), dir, pageSize, tok)
		if err != nil {
			t.Fatalf("List(%q, %d, %q) after %d pages: %v", dir, pageSize, tok, pages-1, err)
		}
		if len(entries) > pageSize && pageSize > 0 {
			t.Fatalf("page %d has %d entries, more than the page size %d", pages, len(entries), pageSize)
		}
		all = append(all, entries...)
		if next == "" {
			return all, pages
		}
		tok = next
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	s, dir := newTestStore(t, Options{})
	for name, data := range map[string]string{"a": "abc", "B": "", "a.b": "x", "ab": "xy", "d/inner": "1", "d/e/deeper": "2"} {
		if _, err := s.Write(ctx, name, 0, []byte(data), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../..", filepath.Join(dir, "d", "out")); err != nil {
		t.Fatal(err)
	}
	root := []DirEntry{
		{Name: "B"}, {Name: "a", Size: 3}, {Name: "a.b", Size: 1}, {Name: "ab", Size: 2},
		{Name: "d", IsDir: true}, {Name: "link"},
	}
	tests := []struct {
		dir      string
		pageSize int
		want     []DirEntry
		pages    int
	}{
		{"", 0, root, 1},
		{"", 1, root, 6},
		{"", 4, root, 2},
		{"", 6, root, 1},
		{"", MaxListPageSize, root, 1},
		{"d", 0, []DirEntry{{Name: "e", IsDir: true}, {Name: "inner", Size: 1}, {Name: "out"}}, 1},
		{"d/e", 1, []DirEntry{{Name: "deeper", Size: 1}}, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q/%d", tt.dir, tt.pageSize), func(t *testing.T) {
			got, pages := listAll(t, s, tt.dir, tt.pageSize)
			if !slices.Equal(got, tt.want) || pages != tt.pages {
				t.Errorf("got %v in %d pages, want %v in %d", got, pages, tt.want, tt.pages)
			}
		})
	}

	// An empty directory is one empty page.
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if entries, next, err := s.List(ctx, "empty", 0, ""); err != nil || len(entries) != 0 || next != "" {
		t.Errorf("List(empty) = %v, %q, %v; want no entries and no next page", entries, next, err)
	}

	other := base64.RawURLEncoding.EncodeToString([]byte("x1:a"))
	slash := base64.RawURLEncoding.EncodeToString([]byte(pageTokenPrefix + "a/b"))
	rejects := []struct {
		name     string
		dir      string
		pageSize int
		token    string
		want     error
		message  string
	}{
		{"negative page size", "", -1, "", ErrInvalidPage, "10000"},
		{"page size over the maximum", "", MaxListPageSize + 1, "", ErrInvalidPage, "10000"},
		{"token not base64", "", 0, "not a token!", ErrInvalidPage, ""},
		{"token of another form", "", 0, other, ErrInvalidPage, ""},
		{"token naming a path", "", 0, slash, ErrInvalidPage, ""},
		{"missing directory", "nodir", 0, "", ErrNotFound, ""},
		{"a file", "a", 0, "", ErrInvalidPath, "not a directory"},
		{"below a file", "a/b", 0, "", ErrInvalidPath, ""},
		{"dotdot", "../x", 0, "", ErrInvalidPath, ""},
		{"the root as a dot", ".", 0, "", ErrInvalidPath, ""},
		{"through a symlink out of the root", "d/out", 0, "", ErrPathEscapes, ""},
	}
	for _, tt := range rejects {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.List(ctx, tt.dir, tt.pageSize, tt.token)
			if !errors.Is(err, tt.want) || !strings.Contains(fmt.Sprint(err), tt.message) {
				t.Errorf("got %v, want %v saying %q", err, tt.want, tt.message)
			}
		})
	}
}

// TestListDefaultPageSize: 0 means DefaultListPageSize entries a page.
func TestListDefaultPageSize(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	for i := range DefaultListPageSize + 1 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	entries, next, err := s.List(context.Background(), "", 0, "")
	if err != nil || len(entries) != DefaultListPageSize || next == "" {
		t.Fatalf("first page: %d entries, next %q, %v; want %d and a next page", len(entries), next, err, DefaultListPageSize)
	}
	entries, next, err = s.List(context.Background(), "", 0, next)
	if err != nil || len(entries) != 1 || entries[0].Name != fmt.Sprintf("f%05d", DefaultListPageSize) || next != "" {
		t.Errorf("second page: %v, next %q, %v; want the last file and no next page", entries, next, err)
	}
}

// TestListPagingUnderChurn pages through a directory while other clients
// create and delete files in it through the store: every file present
// throughout is listed exactly once a pass, and no name twice.
func TestListPagingUnderChurn(t *testing.T) {
	const stable, churners, passes, pageSize = 200, 3, 6, 7
	ctx := context.Background()
	s, _ := newTestStore(t, Options{})
	want := map[string]bool{}
	for i := range stable {
		name := fmt.Sprintf("s%03d", i*5)
		want[name] = true
		if _, err := s.Write(ctx, "dir/"+name, 0, []byte("x"), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Names that sort between the stable ones, before and
				// after the pages being read.
				name := fmt.Sprintf("dir/s%03d-%d", (i*37+c*11)%(stable*5), c)
				if _, err := s.Write(ctx, name, 0, []byte("c"), SyncNone); err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					if err := s.Delete(ctx, name, false); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for pass := range passes {
		entries, _ := listAll(t, s, "dir", pageSize)
		seen := map[string]int{}
		for i, e := range entries {
			seen[e.Name]++
			if i > 0 && e.Name <= entries[i-1].Name {
				t.Errorf("pass %d: %q listed after %q", pass, e.Name, entries[i-1].Name)
			}
		}
		for name := range want {
			if seen[name] != 1 {
				t.Errorf("pass %d: %s listed %d times, want once", pass, name, seen[name])
			}
		}
	}
	close(stop)
	wg.Wait()
}

// TestListLeavesOutNamesNotUTF8: a name that is not valid UTF-8, made
// outside the store, is left out of every page (no path the store accepts
// names it, and the daemon's replies cannot carry it), the pages around it
// go on as usual, and the store reports it once, however often it is
// listed. Such a name once went into the page, and the daemon failed every
// List of the directory with INTERNAL.
func TestListLeavesOutNamesNotUTF8(t *testing.T) {
	ctx := context.Background()
	var logs strings.Builder
	var logMu sync.Mutex
	s, dir := newTestStore(t, Options{Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	for _, name := range []string{"d/a", "d/c"} {
		if _, err := s.Write(ctx, name, 0, []byte("x"), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"b\xff", "\xc3"} {
		if err := os.WriteFile(filepath.Join(dir, "d", bad), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := []DirEntry{{Name: "a", Size: 1}, {Name: "c", Size: 1}}
	for _, pageSize := range []int{1, 2, 0} {
		got, _ := listAll(t, s, "d", pageSize)
		if !slices.Equal(got, want) {
			t.Errorf("List(d) by pages of %d: got %+v, want %+v", pageSize, got, want)
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	// The text handler quotes the quoted name again.
	for _, bad := range []string{`b\\xff`, `\\xc3`} {
		if n := strings.Count(logs.String(), bad); n != 1 {
			t.Errorf("%s logged %d times, want once; log:\n%s", bad, n, logs.String())
		}
	}
}

// lockedWriter is an io.Writer safe for concurrent use.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

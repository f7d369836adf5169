//go:build linux

package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStagedNames(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"u-1234_abc.info", true},
		{"", false},
		{".hidden", false},
		{"a/b", false},
		{"..", false},
		{"a b", false},
		{string(make([]byte, MaxStagedNameLen+1)), false},
	} {
		h, err := s.OpenStaged(ctx, tc.name, OpenCreate)
		if got := err == nil; got != tc.ok {
			t.Errorf("OpenStaged(%q): got err %v, want ok %v", tc.name, err, tc.ok)
		}
		if err == nil {
			h.Close()
		} else if !errors.Is(err, ErrInvalidPath) {
			t.Errorf("OpenStaged(%q): got %v, want ErrInvalidPath", tc.name, err)
		}
	}
	// A path may not reach a staged file.
	if _, err := s.Stat(ctx, stagedDir+"/u-1234_abc.info"); !errors.Is(err, ErrInvalidPath) {
		t.Errorf("Stat of a staged path: got %v, want ErrInvalidPath", err)
	}
}

// TestStagedPublish: a staged file is out of List's sight until Publish
// gives it a name, whole, with its attributes; the name it replaces is
// replaced, or kept with noReplace.
func TestStagedPublish(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.Write(ctx, "d/old", 0, []byte("old"), SyncNone); err != nil {
		t.Fatal(err)
	}
	h, err := s.OpenStaged(ctx, "up1", OpenExclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := s.OpenStaged(ctx, "up1", OpenExclusive); !errors.Is(err, ErrExists) {
		t.Errorf("second exclusive OpenStaged: got %v, want ErrExists", err)
	}
	for i, piece := range []string{"hello, ", "world"} {
		if _, err := h.Write(ctx, int64(i*7), []byte(piece), SyncNone); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Sync(ctx, SyncData); err != nil {
		t.Fatal(err)
	}
	if err := h.SetAttr(AttrContentType, []byte("text/plain")); err != nil {
		t.Fatal(err)
	}
	ents, _, err := s.List(ctx, "", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name != "d" {
		t.Errorf("List of the root: got %v, want only d", ents)
	}
	staged, err := s.Staged()
	if err != nil || len(staged) != 1 || staged[0].Name != "up1" || staged[0].Size != 12 {
		t.Errorf("Staged: got %v, %v, want up1 of 12 bytes", staged, err)
	}

	if err := s.Publish(ctx, "up1", "d/old", true); !errors.Is(err, ErrExists) {
		t.Errorf("Publish with noReplace over a file: got %v, want ErrExists", err)
	}
	if err := s.Publish(ctx, "up1", "d/old", false); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, dir, "d/old"); string(got) != "hello, world" {
		t.Errorf("published: got %q", got)
	}
	st, err := s.Stat(ctx, "d/old")
	if err != nil {
		t.Fatal(err)
	}
	if st.ContentType != "text/plain" {
		t.Errorf("content type after Publish: got %q, want text/plain", st.ContentType)
	}
	if staged, _ := s.Staged(); len(staged) != 0 {
		t.Errorf("Staged after Publish: got %v, want none", staged)
	}
	if err := s.RemoveStaged(ctx, "up1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveStaged after Publish: got %v, want ErrNotFound", err)
	}
}

// TestStagedPublishIf: a publish under a condition on the file it would
// replace checks it under that file's lock; a failed check leaves the
// file and the staged file as they were.
func TestStagedPublishIf(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	ctx := context.Background()
	w, err := s.Write(ctx, "d/old", 0, []byte("old"), SyncNone)
	if err != nil {
		t.Fatal(err)
	}
	h, err := s.OpenStaged(ctx, "up1", OpenExclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.Write(ctx, 0, []byte("new"), SyncNone); err != nil {
		t.Fatal(err)
	}
	stale, none := w.Generation-1, int64(0)
	for _, c := range []struct {
		name string
		p    string
		pre  Precondition
	}{
		{"a stale generation", "d/old", Precondition{IfMatch: &stale}},
		{"no file may exist", "d/old", Precondition{IfMatch: &none}},
		{"its own generation not", "d/old", Precondition{IfNotMatch: &w.Generation}},
		{"a file must exist", "d/missing", Precondition{IfNotMatch: &none}},
	} {
		var mismatch *GenerationMismatch
		if err := s.PublishIf(ctx, "up1", c.p, false, c.pre); !errors.As(err, &mismatch) {
			t.Errorf("%s: got %v, want a *GenerationMismatch", c.name, err)
		}
	}
	if got := readFile(t, dir, "d/old"); string(got) != "old" {
		t.Errorf("after refused publishes: got %q, want old", got)
	}
	if staged, _ := s.Staged(); len(staged) != 1 {
		t.Errorf("Staged after refused publishes: got %v, want up1", staged)
	}
	neg := int64(-1)
	if err := s.PublishIf(ctx, "up1", "d/old", false, Precondition{IfMatch: &neg}); !errors.Is(err, ErrInvalidOffset) {
		t.Errorf("a negative generation: got %v, want ErrInvalidOffset", err)
	}
	if err := s.PublishIf(ctx, "up1", "d/old", false, Precondition{IfMatch: &w.Generation}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, dir, "d/old"); string(got) != "new" {
		t.Errorf("published: got %q, want new", got)
	}
}

func TestStagedTruncateAndRemove(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	h, err := s.OpenStaged(ctx, "t", OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.Write(ctx, 0, bytes.Repeat([]byte("x"), 100), SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := h.Truncate(ctx, 40); err != nil {
		t.Fatal(err)
	}
	if got := h.Size(); got != 40 {
		t.Errorf("size after Truncate: got %d, want 40", got)
	}
	if err := h.Truncate(ctx, -1); !errors.Is(err, ErrInvalidOffset) {
		t.Errorf("Truncate(-1): got %v, want ErrInvalidOffset", err)
	}
	if err := s.RemoveStaged(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write(ctx, 0, []byte("y"), SyncNone); !errors.Is(err, ErrDeleted) {
		t.Errorf("Write after RemoveStaged: got %v, want ErrDeleted", err)
	}
}

func TestRecords(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	if _, err := s.Record("r1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Record of none: got %v, want ErrNotFound", err)
	}
	for _, v := range []string{"first", "second, longer"} {
		if err := s.PutRecord("r1", []byte(v)); err != nil {
			t.Fatal(err)
		}
		got, err := s.Record("r1")
		if err != nil || string(got) != v {
			t.Errorf("Record: got %q, %v, want %q", got, err, v)
		}
	}
	if err := s.PutRecord("r1", make([]byte, MaxRecordLen+1)); !errors.Is(err, ErrRequestTooLarge) {
		t.Errorf("PutRecord over the limit: got %v, want ErrRequestTooLarge", err)
	}
	// A temporary left by a crash is not a record.
	if err := os.WriteFile(filepath.Join(dir, recordsDir, ".r2"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := s.Records()
	if err != nil || len(recs) != 1 || recs[0].Name != "r1" {
		t.Errorf("Records: got %v, %v, want r1 alone", recs, err)
	}
	if err := s.RemoveRecord("r1"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveRecord("r1"); err != nil {
		t.Errorf("RemoveRecord of none: got %v, want nil", err)
	}
}

func TestCopyFrom(t *testing.T) {
	s, dir := newTestStore(t, Options{MaxFileSize: 1 << 20})
	ctx := context.Background()
	src := bytes.Repeat([]byte("0123456789abcdef"), 8192) // 128 KiB
	if _, err := s.Write(ctx, "src", 0, src, SyncNone); err != nil {
		t.Fatal(err)
	}
	sh, err := s.OpenHandle(ctx, "src", OpenMustExist)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	dh, err := s.OpenStaged(ctx, "dst", OpenCreate)
	if err != nil {
		t.Fatal(err)
	}
	defer dh.Close()
	for _, tc := range []struct {
		name              string
		srcOff, dstOff, n int64
		want              int64
		wantErr           error
	}{
		{"whole", 0, 0, int64(len(src)), int64(len(src)), nil},
		{"appended", 0, int64(len(src)), int64(len(src)), int64(len(src)), nil},
		{"past src's end", int64(len(src)) - 10, 2 * int64(len(src)), 100, 10, nil},
		{"past the size limit", 0, 1 << 20, 1, 0, ErrFileTooLarge},
		{"negative", -1, 0, 1, 0, ErrInvalidOffset},
	} {
		got, err := dh.CopyFrom(ctx, sh, tc.srcOff, tc.dstOff, tc.n)
		if got != tc.want || !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: got %d, %v, want %d, %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
	if err := s.Publish(ctx, "dst", "copy", false); err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte{}, src...), src...), src[len(src)-10:]...)
	if got := readFile(t, dir, "copy"); !bytes.Equal(got, want) {
		t.Errorf("copy: got %d bytes, want %d, equal %v", len(got), len(want), bytes.Equal(got, want))
	}
	// The map follows the copy: the store reads what it copied.
	got, err := s.Read(ctx, "copy", int64(len(src)), 16)
	if err != nil || string(got) != "0123456789abcdef" {
		t.Errorf("Read of the copy: got %q, %v", got, err)
	}
}

func TestDirectories(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.Write(ctx, "f", 0, []byte("x"), SyncNone); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		op   func() error
		want error
	}{
		{"mkdir", func() error { return s.Mkdir(ctx, "a") }, nil},
		{"mkdir again", func() error { return s.Mkdir(ctx, "a") }, ErrExists},
		{"mkdir over a file", func() error { return s.Mkdir(ctx, "f") }, ErrExists},
		{"mkdir without parent", func() error { return s.Mkdir(ctx, "x/y") }, ErrNotFound},
		{"mkdir below", func() error { return s.Mkdir(ctx, "a/b") }, nil},
		{"remove non-empty", func() error { return s.RemoveDir(ctx, "a", true) }, ErrNotEmpty},
		{"remove a file", func() error { return s.RemoveDir(ctx, "f", false) }, ErrInvalidPath},
		{"remove missing", func() error { return s.RemoveDir(ctx, "nope", false) }, ErrNotFound},
		{"remove empty", func() error { return s.RemoveDir(ctx, "a/b", true) }, nil},
		{"dir of a file", func() error { _, err := s.Dir(ctx, "f"); return err }, ErrInvalidPath},
		{"dir of the root", func() error { _, err := s.Dir(ctx, ""); return err }, nil},
		{"dir of a", func() error { _, err := s.Dir(ctx, "a"); return err }, nil},
	} {
		if err := tc.op(); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestAttrs(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.Write(ctx, "f", 0, []byte("x"), SyncNone); err != nil {
		t.Fatal(err)
	}
	if err := s.Mkdir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"f", "d"} {
		if v, err := s.Attr(ctx, p, "props"); err != nil || v != nil {
			t.Errorf("Attr of %s before: got %q, %v, want none", p, v, err)
		}
		if err := s.SetAttr(ctx, p, "props", []byte("<x/>")); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Attr(ctx, p, "props"); err != nil || string(v) != "<x/>" {
			t.Errorf("Attr of %s: got %q, %v", p, v, err)
		}
		if err := s.SetAttr(ctx, p, "props", nil); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Attr(ctx, p, "props"); err != nil || v != nil {
			t.Errorf("Attr of %s after removal: got %q, %v, want none", p, v, err)
		}
	}
	if err := s.SetAttr(ctx, "nope", "props", []byte("x")); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetAttr of a missing file: got %v, want ErrNotFound", err)
	}
	if err := s.SetAttr(ctx, "f", "big", make([]byte, MaxAttrLen)); !errors.Is(err, ErrFileTooLarge) {
		t.Errorf("SetAttr beyond what ext4 keeps: got %v, want ErrFileTooLarge", err)
	}
	if err := s.SetAttr(ctx, "f", AttrContentType, []byte("image/png")); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stat(ctx, "f"); err != nil || st.ContentType != "image/png" {
		t.Errorf("Stat: got %q, %v, want image/png", st.ContentType, err)
	}
}

func TestCheckContentType(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"image/png", "image/png", true},
		{"Text/Plain; Charset=UTF-8", "text/plain; charset=UTF-8", true},
		{"text", "", false},
		{"", "", false},
		{"/png", "", false},
		{"text/plain; x=\"\x01\"", "", false},
		{"image/" + strings.Repeat("x", 300), "", false},
		{"text/plain; name=\u00e9", "", false},
	} {
		got, err := CheckContentType(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("CheckContentType(%q): got %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidContentType) {
			t.Errorf("CheckContentType(%q): %v is no ErrInvalidContentType", tc.in, err)
		}
	}
}

package client_test

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/filewrite/filewrite/client"
	"github.com/filewrite/filewrite/service"
)

// TestCopy: io.Copy into a Writer and out of a Reader moves every byte,
// whichever of ReaderFrom, WriterTo or plain Write and Read io.Copy picks,
// with sizes that are not multiples of a piece.
func TestCopy(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	c := dial(t, d.addr, client.WithMaxMessageBytes(64<<10)) // pieces of 32 KiB
	data := pattern(1<<20+12345, 3)
	// onlyReader and onlyWriter hide WriterTo and ReaderFrom, so that
	// io.Copy takes the other path.
	type onlyReader struct{ io.Reader }
	type onlyWriter struct{ io.Writer }
	for _, tt := range []struct {
		name     string
		into     func(w *client.Writer) (int64, error)
		outOf    func(r *client.Reader, dst *bytes.Buffer) (int64, error)
		writeOff int64
	}{
		{"ReaderFrom and WriterTo", func(w *client.Writer) (int64, error) { return io.Copy(w, onlyReader{bytes.NewReader(data)}) },
			func(r *client.Reader, dst *bytes.Buffer) (int64, error) { return io.Copy(onlyWriter{dst}, r) }, 0},
		{"Write and Read", func(w *client.Writer) (int64, error) {
			return io.Copy(onlyWriter{w}, onlyReader{bytes.NewReader(data)})
		},
			func(r *client.Reader, dst *bytes.Buffer) (int64, error) { return io.Copy(dst, onlyReader{r}) }, 0},
		{"one big Write, at an offset", func(w *client.Writer) (int64, error) { return io.Copy(w, bytes.NewReader(data)) },
			func(r *client.Reader, dst *bytes.Buffer) (int64, error) { return io.Copy(dst, r) }, 777},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := openFile(t, ctx, c, "copy/"+tt.name)
			defer f.Close()
			w := f.NewWriter(tt.writeOff)
			if n, err := tt.into(w); n != int64(len(data)) || err != nil {
				t.Fatalf("copy in: %d, %v; want %d, nil", n, err, len(data))
			}
			if err := w.Close(); err != nil {
				t.Fatalf("Writer.Close: %v", err)
			}
			var got bytes.Buffer
			if n, err := tt.outOf(f.NewReader(tt.writeOff), &got); n != int64(len(data)) || err != nil {
				t.Fatalf("copy out: %d, %v; want %d, nil", n, err, len(data))
			}
			if !bytes.Equal(got.Bytes(), data) {
				t.Error("copied out other bytes than copied in")
			}
			if onDisk := d.onDisk(t, "copy/"+tt.name); !bytes.Equal(onDisk[tt.writeOff:], data) {
				t.Error("the file holds other bytes than copied in")
			}
		})
	}
}

// TestWriterReportsFailure: a write of a Writer that fails is reported by
// a later call, Close included, and stops the Writer.
func TestWriterReportsFailure(t *testing.T) {
	d := startDaemon(t, func(c *service.Config) { c.Store.MaxFileSize = 100 << 10 })
	ctx := testContext(t)
	c := dial(t, d.addr, client.WithMaxMessageBytes(64<<10))
	f := openFile(t, ctx, c, "copy/limit")
	defer f.Close()
	// ReadFrom waits for every ack: io.Copy reports the failure.
	w := f.NewWriter(0)
	_, err := io.Copy(w, struct{ io.Reader }{bytes.NewReader(pattern(200<<10, 1))})
	if status.Code(err) != codes.OutOfRange {
		t.Errorf("io.Copy past the file size limit: %v, want %v", err, codes.OutOfRange)
	}
	if _, err := w.Write([]byte("more")); status.Code(err) != codes.OutOfRange {
		t.Errorf("Write after the failure: %v, want it again", err)
	}
	if err := w.Close(); status.Code(err) != codes.OutOfRange {
		t.Errorf("Close: %v, want the failure", err)
	}
	// Write does not wait: Close reports the failure.
	w = f.NewWriter(0)
	if _, err := w.Write(pattern(200<<10, 2)); err != nil {
		t.Errorf("Write that fails later: %v, want nil (not yet known)", err)
	}
	if err := w.Close(); status.Code(err) != codes.OutOfRange {
		t.Errorf("Close after a failed Write: %v, want %v", err, codes.OutOfRange)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("Write after Close: nil, want an error")
	}
	if err := f.Close(); err != nil {
		t.Errorf("File.Close: %v", err)
	}
	if _, err := f.NewWriter(0).Write([]byte("x")); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Writer.Write after File.Close: %v, want fs.ErrClosed", err)
	}
	if _, err := f.NewReader(0).Read(make([]byte, 1)); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Reader.Read after File.Close: %v, want fs.ErrClosed", err)
	}
}

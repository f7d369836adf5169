package client_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/filewrite/filewrite/client"
)

// BenchmarkCopy16MiB measures io.Copy of 16 MiB into and out of a File
// against one WriteAt and one ReadAt of the same bytes, in one run: before
// (io.NewOffsetWriter and io.SectionReader over the File, 32 KiB per call,
// each waiting for its answer) and after (File.NewWriter, File.NewReader).
// It reports each way's time and its ratio to the single call's. Every
// write goes into a file truncated to 0 first, so each is a fresh,
// extending write of the same shape; every read reads the same file.
func BenchmarkCopy16MiB(b *testing.B) {
	const size = 16 << 20
	d := startDaemon(b, nil)
	c, err := client.Dial(d.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := b.Context()
	data := pattern(size, 5)
	// Hide io.WriterTo and io.ReaderFrom of the buffers, so that io.Copy
	// moves 32 KiB at a time, as it does from a file or a socket.
	type onlyReader struct{ io.Reader }
	type onlyWriter struct{ io.Writer }
	ways := []struct {
		name string
		run  func(f *client.File, dst *bytes.Buffer) error
	}{
		{"WriteAt", func(f *client.File, _ *bytes.Buffer) error { _, err := f.WriteAt(data, 0); return err }},
		{"OffsetWriter", func(f *client.File, _ *bytes.Buffer) error {
			_, err := io.Copy(io.NewOffsetWriter(f, 0), onlyReader{bytes.NewReader(data)})
			return err
		}},
		{"NewWriter", func(f *client.File, _ *bytes.Buffer) error {
			w := f.NewWriter(0)
			if _, err := io.Copy(w, onlyReader{bytes.NewReader(data)}); err != nil {
				return err
			}
			return w.Close()
		}},
		{"ReadAt", func(f *client.File, dst *bytes.Buffer) error {
			_, err := f.ReadAt(dst.AvailableBuffer()[:size], 0)
			return err
		}},
		{"SectionReader", func(f *client.File, dst *bytes.Buffer) error {
			_, err := io.Copy(onlyWriter{dst}, io.NewSectionReader(f, 0, size))
			return err
		}},
		{"NewReader", func(f *client.File, dst *bytes.Buffer) error {
			_, err := io.Copy(onlyWriter{dst}, f.NewReader(0))
			return err
		}},
	}
	files := make([]*client.File, len(ways))
	for i, w := range ways {
		if files[i], err = c.Open(ctx, "bench/"+w.name); err != nil {
			b.Fatal(err)
		}
		defer files[i].Close()
	}
	src := files[0] // the reads read what WriteAt wrote
	if _, err := src.WriteAt(data, 0); err != nil {
		b.Fatal(err)
	}
	spent := make([]time.Duration, len(ways))
	var dst bytes.Buffer
	dst.Grow(size)
	b.ResetTimer()
	for b.Loop() {
		for i, w := range ways {
			f := files[i]
			if i >= 3 {
				f = src
			} else if err := f.Truncate(ctx, 0); err != nil {
				b.Fatal(err)
			}
			dst.Reset()
			start := time.Now()
			if err := w.run(f, &dst); err != nil {
				b.Fatalf("%s: %v", w.name, err)
			}
			spent[i] += time.Since(start)
		}
	}
	for i, w := range ways {
		b.ReportMetric(float64(spent[i].Milliseconds())/float64(b.N), w.name+"-ms/op")
	}
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "OffsetWriter/WriteAt")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "NewWriter/WriteAt")
	b.ReportMetric(float64(spent[4])/float64(spent[3]), "SectionReader/ReadAt")
	b.ReportMetric(float64(spent[5])/float64(spent[3]), "NewReader/ReadAt")
}

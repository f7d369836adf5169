package service

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/gzip"
)

// A compressed gRPC message is decompressed by grpc-go, up to the message
// limit, before any handler or interceptor can look at it, and a few
// hundred bytes of gzip become megabytes of zeros: what a call costs would
// no longer be bounded by what its peer sent (docs/guarantees.md). The
// gzip codec is registered in every process that links grpc-go's gzip
// package (the OTLP exporter does), and a server accepts what is
// registered. So the daemon registers gzip again, with a bound on how much
// a message may grow: maxDecompressionRatio times the compressed bytes
// read, plus decompressionAllowance. Past it the call fails before the
// rest is inflated. Compressing (the OTLP exporter's side) is unchanged.
const (
	maxDecompressionRatio  = 32
	decompressionAllowance = 1 << 20
)

// errInflated is returned when a message grows past the bound.
var errInflated = errors.New("the message grows past the daemon's bound on decompression")

func init() {
	if c := encoding.GetCompressor(gzip.Name); c != nil {
		encoding.RegisterCompressor(boundedCompressor{c})
	}
}

// boundedCompressor is a compressor whose Decompress stops at the bound.
type boundedCompressor struct{ encoding.Compressor }

func (c boundedCompressor) Decompress(r io.Reader) (io.Reader, error) {
	in := &countingReader{r: r}
	d, err := c.Compressor.Decompress(in)
	if err != nil {
		return nil, err
	}
	return &boundedReader{r: d, in: in}, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// boundedReader fails once what it has returned passes the bound for the
// compressed bytes read so far.
type boundedReader struct {
	r   io.Reader
	in  *countingReader
	out int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.out += int64(n)
	if limit := maxDecompressionRatio*b.in.n + decompressionAllowance; b.out > limit {
		return 0, fmt.Errorf("%w (%d bytes from %d, at most %dx plus %d)", errInflated, b.out, b.in.n, maxDecompressionRatio, decompressionAllowance)
	}
	return n, err
}

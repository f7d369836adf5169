package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// otlpSink is an OTLP/HTTP trace receiver that keeps nothing: it answers
// every export with success and only counts what arrived, so that a traced
// daemon pays what it would pay a collector on another machine (building,
// batching, encoding and sending its spans) and nothing here decides its
// pace. It counts spans by walking the protobuf's wire format, without
// decoding it into messages: the harness shares the machine with the
// daemon, and a full decode of tens of thousands of spans a second would
// take CPU from the run it measures.
//
// The OTLP/HTTP exchange it implements (OTLP specification, "OTLP/HTTP"):
// POST /v1/traces, a binary-protobuf ExportTraceServiceRequest as the
// body, gzip-compressed if Content-Encoding says so; the answer 200 with a
// binary-protobuf ExportTraceServiceResponse, which an empty body encodes
// (every field absent: nothing was rejected).
type otlpSink struct {
	srv  *http.Server
	addr string // host:port it listens on
	// Counted since the sink started; a run takes the difference.
	exports, bytes, spans atomic.Int64
	bufs                  sync.Pool // *bytes.Buffer, one per export being read
	done                  chan struct{}
}

// startOTLPSink listens on a loopback port the kernel picks.
func startOTLPSink() (*otlpSink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("OTLP sink: %w", err)
	}
	s := &otlpSink{addr: l.Addr().String(), done: make(chan struct{})}
	s.bufs.New = func() any { return new(bytes.Buffer) }
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", s.traces)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		s.srv.Serve(l)
	}()
	return s, nil
}

// endpoint is the URL for OTEL_EXPORTER_OTLP_ENDPOINT, to which the
// exporter appends /v1/traces.
func (s *otlpSink) endpoint() string { return "http://" + s.addr }

// sinkCounts is what the sink has received so far.
type sinkCounts struct{ exports, bytes, spans int64 }

func (s *otlpSink) counts() sinkCounts {
	return sinkCounts{s.exports.Load(), s.bytes.Load(), s.spans.Load()}
}

func (s *otlpSink) close() error {
	err := s.srv.Close()
	<-s.done
	return err
}

func (s *otlpSink) traces(w http.ResponseWriter, r *http.Request) {
	buf := s.bufs.Get().(*bytes.Buffer)
	defer s.bufs.Put(buf)
	buf.Reset()
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	n, err := buf.ReadFrom(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	spans, err := spansIn(buf.Bytes())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.exports.Add(1)
	s.bytes.Add(n)
	s.spans.Add(int64(spans))
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// The field numbers of OTLP's trace protos on the way down to a span:
// ExportTraceServiceRequest.resource_spans = 1, ResourceSpans.scope_spans
// = 2, ScopeSpans.spans = 2.
var spanPath = []protowire.Number{1, 2, 2}

// spansIn counts the spans of an encoded ExportTraceServiceRequest.
func spansIn(msg []byte) (int, error) {
	return countAt(msg, spanPath)
}

// countAt counts the occurrences of the length-delimited field path[0] of
// msg, or, with more of path left, the counts within each occurrence.
func countAt(msg []byte, path []protowire.Number) (int, error) {
	n := 0
	for len(msg) > 0 {
		num, typ, tl := protowire.ConsumeTag(msg)
		if tl < 0 {
			return 0, protowire.ParseError(tl)
		}
		msg = msg[tl:]
		if num != path[0] || typ != protowire.BytesType {
			vl := protowire.ConsumeFieldValue(num, typ, msg)
			if vl < 0 {
				return 0, protowire.ParseError(vl)
			}
			msg = msg[vl:]
			continue
		}
		v, vl := protowire.ConsumeBytes(msg)
		if vl < 0 {
			return 0, protowire.ParseError(vl)
		}
		msg = msg[vl:]
		if len(path) == 1 {
			n++
			continue
		}
		m, err := countAt(v, path[1:])
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}

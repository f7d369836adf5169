package service

import (
	"time"
)

// DefaultMaxWaitersPerFile bounds the queue for one file's lock (the
// store's own default is unbounded). A queue that grows without bound turns
// overload into memory growth and latency for everyone; past this, callers
// get RESOURCE_EXHAUSTED at once and may back off. It is far above the
// concurrency the load scenarios use against one file. The other limits'
// defaults are the store's (store.DefaultMaxFileSize and the rest); see
// docs/guarantees.md.
const DefaultMaxWaitersPerFile = 1024

// DefaultConnAuthTimeout bounds how long a connection may hold a
// descriptor without an authenticated request: long enough for a TLS
// handshake and a first call over a slow link, short enough that a
// stranger must keep opening connections to keep descriptors.
const DefaultConnAuthTimeout = 10 * time.Second

// DefaultBodyTimeout is how long a REST request body may take to deliver
// each gateway.BodyProgressBytes: generous for a slow link, short enough that a
// body sent a byte at a time does not hold its connection for long.
const DefaultBodyTimeout = 30 * time.Second

// DefaultStreamIdleTimeout is how long a WriteStream may stay idle before
// the daemon closes it and gives back its file. An idle stream holds a
// slot of --max-open-files for nobody, so a client that leaves Files open
// can lock others out of new files until then; closing one costs its
// client a new stream (one round trip) at its next write, which the Go
// client opens by itself. Five minutes is well beyond the pauses of a
// writer that is still at work (seconds between bursts, a minute between
// checkpoints), so such a writer rarely pays it, and short enough that
// files left open are given back within minutes.
const DefaultStreamIdleTimeout = 5 * time.Minute

// DefaultMaxInflightBytes bounds the memory of requests in flight: room
// for five gRPC messages at the default --max-request-bytes being received
// at once, or eight decoded 64 MiB Writes, and for very many small
// requests.
const DefaultMaxInflightBytes = 1 << 30

// DefaultMaxStreamBytes bounds the unacknowledged writes one WriteStream
// holds (--max-stream-bytes): far above the pipeline of the client package
// (32 callers of 4 KiB hold 136 KiB), small enough that a thousand open
// streams cannot hold more than a few GiB.
const DefaultMaxStreamBytes = 4 << 20

// DefaultMaxFilesPerStream is --max-files-per-stream's default: the files
// declared on one stream and not yet closed (TOO_MANY_FILES_ON_STREAM past
// it). Each holds an open file of --max-open-files, and a record of a few
// hundred bytes; a client of more files opens more streams, or closes the
// files it is done with.
const DefaultMaxFilesPerStream = 4096

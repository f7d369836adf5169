// Package client is the Go client of filewrite: a Client per daemon (a
// gRPC connection), and a File per open file, whose writes travel on a
// WriteStream.
//
//	c, err := client.Dial("127.0.0.1:50051", client.WithToken(tok))
//	f, err := c.Open(ctx, "ckpt/rank-3.bin", client.WithSync(client.SyncData))
//	n, err := f.WriteAt(buf, off) // from many goroutines at once
//	err = f.Close()               // waits for every write's ack
//
// # Writes
//
// WriteAt and Write go through a WriteStream and are safe for concurrent
// use. Writes that callers start while a message is being sent are
// gathered into the next message, which goes as soon as the send in
// progress ends: there is no timer, so a lone writer pays no delay and
// many writers share messages. Each caller returns when its own write is
// acknowledged, with that write's own error; a write larger than a message
// is split into several. Files of one Client open on the same path share
// one stream (and one open file in the daemon), so their writes coalesce
// too; each File still waits for its own writes.
//
// A write acknowledged without error is applied (every later read sees
// it) and as durable as its SyncMode asks (see the daemon's durability
// contract). A caller whose context ends first gets the context's error
// and learns nothing of the write, which may still land; if it then fails,
// File.Close reports it, so that no failed write goes unreported.
//
// # Errors and retries
//
// Errors are gRPC status errors: status.Code(err) tells them apart
// (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DATA_LOSS, UNAVAILABLE...). When a
// stream breaks, the writes waiting for an ack on it fail with its error
// and the next write opens a new stream. Writes are idempotent (the same
// bytes at the same offset), so WithRetry may resend those whose stream
// broke before their ack; it is off by default. Nothing else is retried:
// Truncate, Allocate, PunchHole and ZeroRange are idempotent too, but a
// retry could land after a later call of the caller's, so the caller
// decides.
//
// # Names
//
// Client.Delete, Client.Rename and Client.List manage the files by name;
// Client.SyncDir makes their changes in a directory durable. A File follows
// its file through a Rename and fails with NOT_FOUND once it is deleted.
// The durable, atomic publish of a file:
//
//	f, err := c.Open(ctx, "ckpt/.step-7.tmp")
//	// ... f.WriteAt ...
//	err = f.Sync(ctx, false)
//	err = f.Close()
//	err = c.Rename(ctx, "ckpt/.step-7.tmp", "ckpt/step-7", client.WithSyncDirs())
//
// Delete and Rename are not retried: a second attempt could act on a file
// made in between, or fail for the first one's success.
//
// # Routing
//
// Every call and every stream carries the file's path in the
// "filewrite-path" metadata header, so that a load balancer (HAProxy with
// deploy/haproxy.cfg) or grpc-go's ring hash can send each file to one
// daemon of several. WithTargets dials several daemons and routes by that
// ring hash itself:
//
//	c, err := client.Dial("", client.WithTargets("10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"))
//
// A daemon that is down fails its own files with UNAVAILABLE; they are
// not sent elsewhere. The README's "More than one machine" gives the
// service config and header for gRPC clients in other languages.
package client

// Package client is the Go client of filewrite: a Client per daemon (a
// gRPC connection), and a File per open file, whose writes travel on a
// WriteStream.
//
//	c, err := client.Dial("127.0.0.1:50051", client.WithToken(tok))
//	f, err := c.Open(ctx, "ckpt/rank-3.bin", client.WithSync(client.SyncData))
//	n, err := f.WriteAt(buf, off) // from many goroutines at once
//	err = f.Close()               // waits for every write's ack
//
// A File lives from Open until Close: the context given to Open bounds
// Open only. Calls that can block take a context, but WriteAt, ReadAt and
// Close, whose signatures are io's; the File's WithTimeout bounds those
// (Write, Read and CloseContext are the same calls with a context). After
// Close, every call fails with an error wrapping fs.ErrClosed, as with
// os.File. Open creates the file if it is missing; WithOpenMode opens an
// existing file only (OpenMustExist) or creates a new one only
// (OpenExclusive).
//
// # Writes
//
// WriteAt and Write go through a WriteStream and are safe for concurrent
// use. Writes that callers start while a message is being sent are
// gathered into the next message, which goes as soon as the send in
// progress ends: there is no timer, so a lone writer pays no delay and
// many writers share messages. Each caller returns when its own write is
// acknowledged, with that write's own error. File.Append goes the same
// way (see its doc). Files of one Client open on the same file share one
// stream (and one open file in the daemon), so their writes coalesce too;
// each File still waits for its own writes.
//
// A write acknowledged without error is applied (every later read sees
// it) and as durable as its SyncMode asks (see the daemon's durability
// contract). A write larger than a piece (1 MiB by default, see
// WithMaxMessageBytes) is sent as several pieces, each applied on its
// own, in any order. A caller whose context ends first gets the context's
// error and learns nothing of the write: pieces already sent may land and
// others not, so the range may hold some new pieces and some old bytes. If
// a piece then fails, File.Close reports it, so that no failed write goes
// unreported.
//
// For sequential copies, File.NewWriter and File.NewReader keep many
// pieces on their way instead of waiting for each: io.Copy into and out of
// them runs at the stream's speed.
//
// # Errors and retries
//
// Errors carry a gRPC status (status.Code(err) tells them apart:
// INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DATA_LOSS, UNAVAILABLE...) and
// wrap the standard errors, so that errors.Is works: NOT_FOUND is
// fs.ErrNotExist, ALREADY_EXISTS fs.ErrExist, PERMISSION_DENIED and
// UNAUTHENTICATED fs.ErrPermission, CANCELED and DEADLINE_EXCEEDED the
// context errors, and a call on a closed File or Client fs.ErrClosed.
//
// When a stream breaks, the writes waiting for an ack on it fail with its
// error and the next write opens a new stream. WithRetry (off by default)
// resends them instead, after a backoff, on a new stream that waits for
// the daemon to come back, within each write's context: a daemon restart
// then costs a pause, not an error. A write whose ack arrived is never
// sent again; the doc of WithRetry says what a resend can do to a range
// that another writer wrote in between. Read, Stat, Extents and List are
// retried by gRPC's own retry policy; File.Append is resent with the
// append ID it carries under WithRetry; Truncate and the Allocate family
// are left to the caller, and Delete and Rename are never retried.
//
// # Names
//
// Client.Delete, Client.Rename and Client.List manage the files by name;
// Client.SyncDir makes their changes in a directory durable; Client.Stat
// describes a file without opening it. A File follows its file through a
// Rename and fails with NOT_FOUND once it is deleted; a File opened on the
// path after that opens the new file. The durable, atomic publish of a
// file:
//
//	f, err := c.Open(ctx, "ckpt/.step-7.tmp")
//	// ... f.WriteAt ...
//	err = f.Sync(ctx)
//	err = f.Close()
//	err = c.Rename(ctx, "ckpt/.step-7.tmp", "ckpt/step-7", client.WithSyncDirs())
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
// not sent elsewhere. docs/cluster.md gives the service config and header
// for gRPC clients in other languages.
//
// # Tracing
//
// WithDialOptions(grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
// makes every call a client span whose context travels to the daemon,
// whose spans then join the caller's trace (docs/client.md).
//
// # Locks
//
// Lock order (opening a path's stream declares its file on a shared
// stream, which takes Client.mu under openMu; Open looks at a path's
// stream, fileStream.mu, under Client.mu):
//
//	fileStream.openMu
//	  Client.mu
//	    fileStream.mu
//	  muxStream.mu       (declare and detach, under openMu; released
//	                      before anything else is taken)
//	  muxStream.sendMu   (a one-slot channel used as a lock around
//	                      SendMsg; nothing is taken while it is held)
//
// muxStream.mu is never held with fileStream.mu or Client.mu: a shared
// stream gives back its user (Client.mu) after it unlocks its own mu.
package client

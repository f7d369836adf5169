// Package streamengine is a WriteStream's write scheduler over
// store.Handle, apart from the stream's gRPC framing (service/internal/rpc)
// as etcd keeps its watchable store apart from v3rpc's watch.go: it takes
// the writes the framing decoded and checked (Stream.Queue), applies them
// with workers that take a stream's files in turn (the runnable FIFO),
// keeps the overlapping writes of a file in arrival order (writeOrder),
// waits for the syncs they owe with a syncer per file, and hands their
// acks, in batches, to the framing's Sender. It also ends a stream whose
// file is deleted, or that stays idle. It imports neither gRPC nor the
// API's protobuf types: its errors are its own (FileDeletedError and the
// rest), which the framing turns into statuses, and it can be driven
// without a server (stream_test.go).
//
// Lock order:
//
//	Stream.mu               (one stream's queues; held across no send nor
//	                        Recv, no wait for a budget, and no store call
//	                        but Handle.Close and Handle.Size)
//	  store's inodeTable.mu (Handle.Close, as a stream gives back a file
//	                        whose last write is acked: releaseLocked;
//	                        store/doc.go orders what it takes)
//
// Stream.mu is never held while the framing waits for a budget or gives
// back to it: the Sender is called without it.
package streamengine

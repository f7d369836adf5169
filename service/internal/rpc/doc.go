// Package rpc is the FileService: the unary handlers (handlers.go), which
// check a request, call the store and map its error with status.Of; the
// paging of Extents and List (paging.go); a Stat's validators (etag.go);
// the routing header a daemon of a cluster requires (pathheader.go); the
// server's codec, which hands WriteStream's messages over undecoded and
// answers a request that does not decode with INVALID_ARGUMENT (codec.go);
// and WriteStream (writestream.go), whose messages are decoded and acks
// encoded by hand (streamwire.go).
//
// Lock order:
//
//	writeStream.mu          (one WriteStream's queues; held across no Send
//	                        or Recv, no wait for a budget, and no store
//	                        call but Handle.Close and Handle.Size)
//	  store's inodeTable.mu (Handle.Close, as a stream gives back a file
//	                        whose last write is acked: releaseLocked;
//	                        store/doc.go orders what it takes)
//
// writeStream.mu is never held while waiting for the in-flight budget nor
// while giving back to it (service/internal/admit).
package rpc

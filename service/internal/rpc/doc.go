// Package rpc is the FileService: the unary handlers (handlers.go), which
// check a request, call the store and map its error with status.Of; the
// paging of Extents and List (paging.go); a Stat's validators (etag.go);
// the routing header a daemon of a cluster requires (pathheader.go); the
// server's codec, which hands WriteStream's messages over undecoded and
// answers a request that does not decode with INVALID_ARGUMENT (codec.go);
// and WriteStream's gRPC framing (writestream.go: Recv, the checks of each
// message, the budgets, and the Send of acks), whose messages are decoded
// and acks encoded by hand (streamwire.go).
//
// A WriteStream's framing (writeStream) holds no lock: its scheduler is
// streamengine's, whose Stream.mu guards the stream's queues and is never
// held while the framing sends, receives, or waits for a budget. The
// engine hands acks to the framing's send, and turns its own errors
// (a file deleted, an id in use, an idle stream) into nothing gRPC: the
// framing maps them to refusals (engineStatus).
package rpc

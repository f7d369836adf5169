// Package nbd serves files as network block devices: the NBD protocol's
// server side, written from the NBD project's protocol document
// (https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md),
// whose section names the comments quote. It is one of the daemon's
// doors (docs/design.md, "Many front doors, one engine"): it owns the
// wire only, and calls a Backend that the daemon implements with the
// store calls its gRPC handlers make (StoreBackend).
//
// What is spoken: the fixed newstyle handshake with NBD_OPT_GO,
// NBD_OPT_INFO, NBD_OPT_EXPORT_NAME, NBD_OPT_LIST, NBD_OPT_ABORT,
// NBD_OPT_STARTTLS, NBD_OPT_STRUCTURED_REPLY, NBD_OPT_LIST_META_CONTEXT
// and NBD_OPT_SET_META_CONTEXT (base:allocation); in transmission every
// request of the document but the experimental ones: READ, WRITE, DISC,
// FLUSH, TRIM, CACHE, WRITE_ZEROES and BLOCK_STATUS, with simple or
// structured replies. Not spoken: oldstyle and non-fixed newstyle
// negotiation, and the extensions (extended headers, resize).
//
// Every length a client sends is checked before memory is taken for it:
// option data against maxOptionData, a request's payload against the
// maximum payload advertised in NBD_INFO_BLOCK_SIZE and then the Budget,
// a reply's extents against maxStatusExtents. A client that breaks a
// mandatory rule the server cannot answer (a bad magic, a refused write
// of more than 32 MiB) is disconnected, as the document allows.
//
// Lock order:
//
//	Server.mu
//	  conn.mu
//
// replyWriter.mu (one connection's socket, while a reply is written) is
// taken with neither held.
package nbd

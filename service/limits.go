package service

import "time"

// DefaultMaxWaitersPerFile bounds the queue for one file's lock (the
// store's own default is unbounded). A queue that grows without bound turns
// overload into memory growth and latency for everyone; past this, callers
// get RESOURCE_EXHAUSTED at once and may back off. It is far above the
// concurrency the load scenarios use against one file. The other limits'
// defaults are the store's (store.DefaultMaxFileSize and the rest); see
// README, "Guarantees and limits".
const DefaultMaxWaitersPerFile = 1024

// DefaultConnAuthTimeout bounds how long a connection may hold a
// descriptor without an authenticated request: long enough for a TLS
// handshake and a first call over a slow link, short enough that a
// stranger must keep opening connections to keep descriptors.
const DefaultConnAuthTimeout = 10 * time.Second

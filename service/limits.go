package service

// DefaultMaxWaitersPerFile bounds the queue for one file's lock (the
// store's own default is unbounded). A queue that grows without bound turns
// overload into memory growth and latency for everyone; past this, callers
// get RESOURCE_EXHAUSTED at once and may back off. It is far above the
// concurrency the load scenarios use against one file. The other limits'
// defaults are the store's (store.DefaultMaxFileSize and the rest); see
// README, "Guarantees and limits".
const DefaultMaxWaitersPerFile = 1024

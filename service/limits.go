package service

import "fmt"

// Defaults of the limits that protect the daemon from its callers (see
// README, "Guarantees and limits"). The size limits are in DefaultConfig.
const (
	// DefaultMaxOpenFiles bounds the descriptors the store holds, well
	// below a typical RLIMIT_NOFILE once raised for a server (the gRPC and
	// HTTP connections need descriptors too).
	DefaultMaxOpenFiles = 1024
	// DefaultMaxWaitersPerFile bounds the queue for one file's lock. A
	// queue that grows without bound turns overload into memory growth
	// and latency for everyone; past this, callers get RESOURCE_EXHAUSTED
	// at once and may back off. It is far above the concurrency the load
	// scenarios use against one file.
	DefaultMaxWaitersPerFile = 1024
)

// validateLimits checks the limits that the store enforces.
func (c Config) validateLimits() error {
	if c.Store.MaxOpenFiles <= 0 {
		return fmt.Errorf("--max-open-files %d: want at least 1", c.Store.MaxOpenFiles)
	}
	if c.Store.MaxWaitersPerFile < 0 {
		return fmt.Errorf("--max-waiters-per-file %d is negative (0 means unbounded)", c.Store.MaxWaitersPerFile)
	}
	return nil
}

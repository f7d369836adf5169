package service

import (
	"os"
	"runtime/debug"
)

// memoryLimitHeadroom is what the Go runtime's memory limit adds to
// --max-inflight-bytes (see limitMemory): the daemon's own memory besides
// requests, and garbage between collections.
const memoryLimitHeadroom = 256 << 20

// limitMemory sets the Go runtime's memory limit to the budget plus
// memoryLimitHeadroom, unless GOMEMLIMIT says otherwise. Without it the
// collector lets the heap grow to twice what was live after the last
// collection: with the budget's worth of requests live, resident memory
// would reach about twice the bound. With it, the collector runs sooner as
// the heap nears the limit. The limit is soft: past it the daemon slows
// (the collector takes up to half the CPU) rather than fail. Run calls it:
// the limit is the process's, not one Server's.
func (s *Server) limitMemory() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := s.cfg.MaxInflightBytes + memoryLimitHeadroom
	debug.SetMemoryLimit(limit)
	s.log.Info("memory limit", "bytes", limit, "from", "--max-inflight-bytes")
}

// Package admit bounds what requests in flight may hold (--max-inflight-bytes
// and --max-stream-bytes): the daemon-wide Budget, the shares a gRPC call
// takes of it around its message and its reply (GRPCBudget, BudgetStream,
// the reply codec), and a WriteStream's own flow control (StreamBudget).
// A request that does not fit waits, in arrival order, until it does or
// its context ends; it never fails for the bound alone. The REST gateway
// takes the same Budget for its bodies.
//
// Lock order: every lock here is a leaf, and none is held while a caller
// waits for the Budget, nor while giving back to it (budgetedStream
// releases after unlocking).
//
//	StreamBudget.mu    (a stream's cost beyond the daemon's budget)
//	Budget.mu          (the daemon-wide budget's free bytes and its waiters)
//	budgetedStream.mu  (what a stream's last message holds)
package admit

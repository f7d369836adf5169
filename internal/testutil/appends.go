package testutil

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// ConcurrentAppends has appenders goroutines make each appends apiece, the
// i-th of appender w by appendOne(w, i), and calls interrupt (a daemon killed
// and started again, connections cut) interrupts times: the k-th once
// k/(interrupts+1) of all the appends have returned. It returns once every
// append has, with each one's offset and error by appender and index.
func ConcurrentAppends(t testing.TB, appenders, each, interrupts int, appendOne func(w, i int) (int64, error), interrupt func()) (offsets [][]int64, errs [][]error) {
	t.Helper()
	offsets, errs = make([][]int64, appenders), make([][]error, appenders)
	var returned atomic.Int64
	var wg sync.WaitGroup
	for w := range appenders {
		offsets[w], errs[w] = make([]int64, each), make([]error, each)
		wg.Go(func() {
			for i := range each {
				offsets[w][i], errs[w][i] = appendOne(w, i)
				returned.Add(1)
			}
		})
	}
	for k := 1; k <= interrupts; k++ {
		WaitFor(t, fmt.Sprintf("appends to return before interruption %d", k), func() bool {
			return returned.Load() >= int64(k*appenders*each/(interrupts+1))
		})
		interrupt()
	}
	wg.Wait()
	return offsets, errs
}

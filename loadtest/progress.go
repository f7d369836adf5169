package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// progress prints one line while a run goes: scenario, configuration,
// round, elapsed time and the rate of the last second. On a terminal the
// line is rewritten in place every second; otherwise (a log file, CI) a
// line is printed every few seconds so that the log stays readable.
type progress struct {
	out      io.Writer
	terminal bool
	every    time.Duration
}

func newProgress(out io.Writer) *progress {
	p := &progress{out: out, every: 5 * time.Second}
	if f, ok := out.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal, p.every = true, time.Second
		}
	}
	return p
}

// start begins reporting a run whose completed operations done counts; the
// returned function ends it.
func (p *progress) start(label string, duration time.Duration, done *atomic.Int64) (end func()) {
	if p == nil || p.out == nil {
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		began := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last, lastAt, printed := done.Load(), began, began
		for {
			select {
			case <-stop:
				if p.terminal {
					fmt.Fprint(p.out, "\r\033[K")
				}
				return
			case now := <-tick.C:
				n := done.Load()
				rate := float64(n-last) / now.Sub(lastAt).Seconds()
				last, lastAt = n, now
				if now.Sub(printed) < p.every-time.Millisecond {
					continue
				}
				printed = now
				line := fmt.Sprintf("%s  %4.0fs/%.0fs  %8.0f ops/s", label, now.Sub(began).Seconds(), duration.Seconds(), rate)
				if p.terminal {
					fmt.Fprint(p.out, "\r\033[K"+line)
				} else {
					fmt.Fprintln(p.out, line)
				}
			}
		}
	}()
	return func() {
		close(stop)
		wg.Wait()
	}
}

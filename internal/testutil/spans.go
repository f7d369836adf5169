package testutil

import (
	"context"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// SpanStarts is a span processor that notes the name of every span that
// starts, so that a test lets a lock holder go only once a waiter's wait
// span has begun: no sleeps, no timing. It passes every call on to the
// processor it wraps (a recorder), and keeps every name until AwaitStart
// passes it, so that it neither blocks the code under test nor drops a
// start.
type SpanStarts struct {
	sdktrace.SpanProcessor

	mu      sync.Mutex
	started []string      // names AwaitStart has not passed yet, in order
	more    chan struct{} // closed, and replaced, when a name is added
}

// NewSpanStarts wraps next.
func NewSpanStarts(next sdktrace.SpanProcessor) *SpanStarts {
	return &SpanStarts{SpanProcessor: next, more: make(chan struct{})}
}

func (p *SpanStarts) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) {
	p.SpanProcessor.OnStart(ctx, s)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started = append(p.started, s.Name())
	close(p.more)
	p.more = make(chan struct{})
}

// AwaitStart waits for a span called name to start, passing over (for
// good) the spans of other names that started before it.
func (p *SpanStarts) AwaitStart(t testing.TB, name string) {
	t.Helper()
	for {
		p.mu.Lock()
		for len(p.started) > 0 {
			got := p.started[0]
			p.started = p.started[1:]
			if got == name {
				p.mu.Unlock()
				return
			}
		}
		more := p.more
		p.mu.Unlock()
		select {
		case <-more:
		case <-t.Context().Done():
			t.Fatalf("no %s span started", name)
		}
	}
}

package uploads

import (
	"context"
	"log/slog"

	expslog "golang.org/x/exp/slog"
)

// bridgeLogger is the daemon's logger as tusd takes one (x/exp/slog's
// Logger, a type of its own), from warnings up: tusd logs every request
// and every chunk at info, which the daemon's own log line per call
// (Calls.Run) says better.
func bridgeLogger(log *slog.Logger) *expslog.Logger {
	return expslog.New(&bridge{h: log.Handler()})
}

// bridge hands x/exp/slog's records to a log/slog handler.
type bridge struct {
	h     slog.Handler
	attrs []expslog.Attr
	group string
}

func (b *bridge) Enabled(ctx context.Context, l expslog.Level) bool {
	return l >= expslog.LevelWarn && b.h.Enabled(ctx, slog.Level(l))
}

func (b *bridge) Handle(ctx context.Context, r expslog.Record) error {
	out := slog.NewRecord(r.Time, slog.Level(r.Level), "tus: "+r.Message, r.PC)
	add := func(a expslog.Attr) bool {
		key := a.Key
		if b.group != "" {
			key = b.group + "." + key
		}
		out.AddAttrs(slog.Any(key, a.Value.Any()))
		return true
	}
	for _, a := range b.attrs {
		add(a)
	}
	r.Attrs(add)
	return b.h.Handle(ctx, out)
}

func (b *bridge) WithAttrs(attrs []expslog.Attr) expslog.Handler {
	return &bridge{h: b.h, attrs: append(append([]expslog.Attr{}, b.attrs...), attrs...), group: b.group}
}

func (b *bridge) WithGroup(name string) expslog.Handler {
	g := name
	if b.group != "" {
		g = b.group + "." + name
	}
	return &bridge{h: b.h, attrs: b.attrs, group: g}
}

//go:build linux

package store

import "context"

// waitNoticeKey carries a WithWaitNotice callback in a context.
type waitNoticeKey struct{}

// WithWaitNotice returns a copy of ctx under which the store calls notice,
// on the caller's goroutine, each time an operation is about to wait for
// another one: for a file lock that others hold, or for the appends below
// its own to complete. A caller that batches the results of several
// operations learns that this one may take long, and need not hold the
// others' results back for it. notice must return quickly and must not
// call the store.
func WithWaitNotice(ctx context.Context, notice func()) context.Context {
	return context.WithValue(ctx, waitNoticeKey{}, notice)
}

// noticeWait calls ctx's WithWaitNotice callback, if it has one. Only
// paths that are about to block call it, so the lookup costs nothing on
// the fast path.
func noticeWait(ctx context.Context) {
	if notice, ok := ctx.Value(waitNoticeKey{}).(func()); ok {
		notice()
	}
}

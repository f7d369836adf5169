//go:build linux

package store

import "context"

// Hooks let tests hold an operation at a known point to observe locking
// without timing. nil in production; a nil field is skipped.
type Hooks struct {
	// InsideWrite runs after a write took its lock (or registered in flight,
	// mode "none") and before its data reaches the file.
	InsideWrite func(ctx context.Context, path, mode, reason string)
}

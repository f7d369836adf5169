//go:build linux

package store

import "context"

// SyncAll is syncAll for the external tests: the daemon syncs every file
// only as it closes (Close), so the store exports no such call.
func (s *Store) SyncAll(ctx context.Context) error { return s.syncAll(ctx) }

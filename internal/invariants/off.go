//go:build !invariants

package invariants

// Enabled is false: this build was made without -tags invariants, and
// code under `if invariants.Enabled` is compiled out.
const Enabled = false

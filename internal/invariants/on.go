//go:build invariants

package invariants

// Enabled is true: this build was made with -tags invariants.
const Enabled = true

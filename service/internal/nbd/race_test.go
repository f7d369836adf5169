//go:build race

package nbd

// raceEnabled: the race detector checks every byte a copy or a system
// call moves, which makes moving hundreds of MiB slow; tests that move
// bulk say how much less they move under it.
const raceEnabled = true

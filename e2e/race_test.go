//go:build race

package e2e

// raceEnabled: the daemon under test is built with -race too, which also
// reuses the packages this test binary was built from.
const raceEnabled = true

// Package invariants says whether this build checks the module's
// invariants as it runs and may carry deliberate breaks for the tests to
// catch, as pebble's internal/invariants does. The `invariants` build tag
// turns it on: the tests run with it (scripts/test.sh, .ci/run:
// `go test -tags invariants`), production builds (the daemon, its image,
// the load harness) leave it out.
//
// Code that only tests should ever run goes under `if invariants.Enabled`:
// without the tag Enabled is the constant false, and the compiler drops
// the branch and whatever only it calls. docs/development.md says how to
// add a deliberate break and how to run the tests with the tag.
package invariants

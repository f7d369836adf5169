package store

// testHooks let tests stop an operation at a known point. nil in production.
type testHooks struct{}

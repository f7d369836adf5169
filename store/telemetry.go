package store

// Telemetry receives the store's lock waits as spans and metrics.
type Telemetry struct{}

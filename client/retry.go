package client

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// What WithRetry retries, and how long it waits: the writes of a broken
// stream (fileStream.mayRetryLocked, in stream.go), and the calls that
// change nothing through gRPC's retry policy.

// retryable reports whether a write that failed with err may be resent:
// only when the daemon could not be reached or went away. Any other error
// is the daemon's answer, which a resend would get again.
func retryable(err error) bool {
	return status.Code(err) == codes.Unavailable
}

// Waits between attempts under WithRetry (backoff).
const (
	retryBaseDelay = 50 * time.Millisecond
	retryMaxDelay  = 2 * time.Second
)

// backoff is the wait before attempt n+1 (n >= 1): doubling from
// retryBaseDelay up to retryMaxDelay, with "equal jitter" (half of it
// random), so that clients cut off together do not come back together.
func backoff(n int) time.Duration {
	d := min(retryBaseDelay<<min(n-1, 16), retryMaxDelay)
	return d/2 + rand.N(d/2+1)
}

// retry calls call until it succeeds or fails for good: with an error
// that is the daemon's answer (not retryable), after retries resends, or
// when ctx ends or stop is closed in the backoff before a resend. It
// returns call's last error; ctx's, naming that one, once ctx ended.
// call is given the attempt, from 1 (a resend may wait for the connection).
func retry(ctx context.Context, stop <-chan struct{}, retries int, call func(attempt int) error) error {
	for attempt := 1; ; attempt++ {
		err := call(attempt)
		if err == nil || !retryable(err) || attempt > retries {
			return err
		}
		if !sleep(ctx, stop, backoff(attempt)) {
			if ctx.Err() != nil {
				return fmt.Errorf("%w while waiting to try again after: %v", ctx.Err(), err)
			}
			return err
		}
	}
}

// sleep waits for d and reports true, or false if ctx ends or stop is
// closed first.
func sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-stop:
	}
	return false
}

// retriedMethods are the calls that gRPC's retry policy retries under
// WithRetry: they change nothing, so a second attempt is always safe.
var retriedMethods = []string{"Read", "Stat", "Extents", "List"}

// withRetryPolicy adds to the service config (JSON, "" for none) a
// method config that waits for the connection and retries the calls of
// retriedMethods on UNAVAILABLE, when retries > 0.
func withRetryPolicy(config string, retries int) (string, error) {
	if retries == 0 {
		return config, nil
	}
	sc := map[string]any{}
	if config != "" {
		if err := json.Unmarshal([]byte(config), &sc); err != nil {
			return "", fmt.Errorf("filewrite client: service config: %w", err)
		}
	}
	var names []map[string]string
	for _, m := range retriedMethods {
		names = append(names, map[string]string{"service": filewritev1.FileService_ServiceDesc.ServiceName, "method": m})
	}
	sc["methodConfig"] = []map[string]any{{
		"name":         names,
		"waitForReady": true,
		"retryPolicy": map[string]any{
			// gRPC caps attempts at 5 unless the channel allows more.
			"maxAttempts":          min(retries+1, 5),
			"initialBackoff":       fmt.Sprintf("%gs", retryBaseDelay.Seconds()),
			"maxBackoff":           fmt.Sprintf("%gs", retryMaxDelay.Seconds()),
			"backoffMultiplier":    2,
			"retryableStatusCodes": []string{"UNAVAILABLE"},
		},
	}}
	b, err := json.Marshal(sc)
	return string(b), err
}

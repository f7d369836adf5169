package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// profile starts, with -profile, the capture of the daemon's Go profiles
// over a run through its --pprof-addr: the CPU profile, and the heap
// allocations the run makes (a delta of the allocs profile), each for the
// run's duration. They go to -out as <comparison>/r<round>-<column>.cpu.pprof
// and .allocs.pprof (`go tool pprof -top FILE`; `-sample_index=alloc_space`
// or `alloc_objects` for the second). The returned function waits for both
// and reports the first error. Without -profile, or for a column without a
// daemon of the harness's, it captures nothing.
//
// A CPU profile is made of proportions (where the daemon's time went), so
// it says something even on a machine that others load; its rates do not.
func (e *env) profile(ctx context.Context, c *comparison, col column, s *session) func() error {
	if !e.opts.profile || s.daemon == nil || s.daemon.pprofAddr == "" {
		return func() error { return nil }
	}
	secs := max(1, int(s.duration/time.Second))
	base := filepath.Join(e.opts.out, c.name, fmt.Sprintf("r%d-%s", s.round, col.name))
	errs := make(chan error, 2)
	for _, p := range []struct{ kind, path string }{
		{"cpu", "/debug/pprof/profile"},
		{"allocs", "/debug/pprof/allocs"},
	} {
		url := fmt.Sprintf("http://%s%s?seconds=%d", s.daemon.pprofAddr, p.path, secs)
		go func() { errs <- fetchProfile(ctx, url, base+"."+p.kind+".pprof", time.Duration(secs)*time.Second) }()
	}
	return func() error { return errors.Join(<-errs, <-errs) }
}

// fetchProfile saves the profile at url, which takes d to gather, to path.
func fetchProfile(ctx context.Context, url, path string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("profile %s: %s: %s", url, resp.Status, msg)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	return errors.Join(err, f.Close())
}

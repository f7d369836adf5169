package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// daemonStats is what a run cost the daemon beyond CPU, for the scenarios
// that watch its files (files): memory and descriptors when the run ended,
// and what its metrics say the run did.
type daemonStats struct {
	memory
	// FDs is how many descriptors the daemon held (/proc/PID/fd).
	FDs int `json:"fds"`
	// OpenFiles and CacheEntries are the store's gauges at the end: files
	// held open, and closed files whose extent maps it keeps.
	OpenFiles    int64 `json:"open_files"`
	CacheEntries int64 `json:"extent_cache_entries"`
	// Opens is the files the store opened during the run (all of them
	// reopens: the setup opened every file before), and CacheHits those
	// whose extent map came from the extent cache rather than FIEMAP.
	Opens     int64 `json:"opens"`
	CacheHits int64 `json:"cache_hits"`
	// DirSyncs is the fsyncs of directories during the run, and
	// DirSyncCallers the callers they covered (first syncs of new files).
	DirSyncs       int64 `json:"dir_syncs"`
	DirSyncCallers int64 `json:"dir_sync_callers"`
	// FileSyncs is the fdatasyncs and fsyncs of files during the run.
	FileSyncs int64 `json:"file_syncs"`
}

// daemonCounters are the cumulative metrics a run's figures are the
// difference of.
type daemonCounters struct {
	opens, hits, dirSyncs, dirCallers, fileSyncs int64
	openFiles, cacheEntries                      int64
}

// scrapeCounters reads the daemon's /metrics at httpAddr.
func scrapeCounters(ctx context.Context, httpAddr string) (daemonCounters, error) {
	m, err := readMetrics(ctx, httpAddr)
	if err != nil {
		return daemonCounters{}, err
	}
	return daemonCounters{
		opens:        int64(m.sum("filewrite_file_opens_total", "")),
		hits:         int64(m.sum("filewrite_file_opens_total", `filewrite_extents_source="cache"`)),
		dirSyncs:     int64(m.sum("filewrite_dir_fsync_batch_size_count", "")),
		dirCallers:   int64(m.sum("filewrite_dir_fsync_batch_size_sum", "")),
		fileSyncs:    int64(m.sum("filewrite_fsync_batch_size_count", "")),
		openFiles:    int64(m.sum("filewrite_open_files", "")),
		cacheEntries: int64(m.sum("filewrite_extent_cache_entries", "")),
	}, nil
}

// readMetrics reads the daemon's /metrics at httpAddr.
func readMetrics(ctx context.Context, httpAddr string) (metricSamples, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parseMetrics(bufio.NewScanner(resp.Body))
}

// metricSamples are the samples of Prometheus's text format: each line
// "name{labels} value", by name.
type metricSamples map[string][]metricSample

type metricSample struct {
	labels string
	value  float64
}

func parseMetrics(sc *bufio.Scanner) (metricSamples, error) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	m := metricSamples{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("/metrics: line %q has no value", line)
		}
		value, _, _ = strings.Cut(strings.TrimSpace(value), " ") // a timestamp may follow
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics: line %q: %w", line, err)
		}
		name, labels, _ := strings.Cut(series, "{")
		m[name] = append(m[name], metricSample{labels: strings.TrimSuffix(labels, "}"), value: v})
	}
	return m, sc.Err()
}

// sum adds the samples of name whose labels contain label ("" for all).
func (m metricSamples) sum(name, label string) float64 {
	var total float64
	for _, s := range m[name] {
		if label == "" || strings.Contains(s.labels, label) {
			total += s.value
		}
	}
	return total
}

// openFDs counts the descriptors process pid holds.
func openFDs(pid int) (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	return len(entries), nil
}

// statsSince is the daemon's figures for a run that started at before.
func statsSince(ctx context.Context, pid int, httpAddr string, before daemonCounters) (*daemonStats, error) {
	after, err := scrapeCounters(ctx, httpAddr)
	if err != nil {
		return nil, err
	}
	mem, err := procMemory(pid)
	if err != nil {
		return nil, err
	}
	fds, err := openFDs(pid)
	if err != nil {
		return nil, err
	}
	return &daemonStats{
		memory:         mem,
		FDs:            fds,
		OpenFiles:      after.openFiles,
		CacheEntries:   after.cacheEntries,
		Opens:          after.opens - before.opens,
		CacheHits:      after.hits - before.hits,
		DirSyncs:       after.dirSyncs - before.dirSyncs,
		DirSyncCallers: after.dirCallers - before.dirCallers,
		FileSyncs:      after.fileSyncs - before.fileSyncs,
	}, nil
}

package deploy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

const (
	clusterFiles = 300
	halfSize     = 4096 // each file gets two writes of this size
	truncSize    = 6000
)

// restCall sends one request through the proxy and returns its status and
// body.
func restCall(c *http.Client, method, url, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// restLifecycle writes file i through the proxy in two writes (JSON, then
// raw PUT), reads it back, truncates it, syncs it and stats it. Every verb
// of a path must reach the daemon that holds the file: on any other daemon
// the read, truncate, fsync and Stat find no file.
func restLifecycle(c *http.Client, base, path string, i int) error {
	want := content(i, 2*halfSize)
	u := base + "/v1/files/" + path
	steps := []struct {
		method, url, ctype string
		body               []byte
	}{
		{"POST", u + ":write", "application/json", []byte(fmt.Sprintf(`{"offset":"0","data":%q}`, base64.StdEncoding.EncodeToString(want[:halfSize])))},
		{"PUT", fmt.Sprintf("%s?offset=%d", u, halfSize), "application/octet-stream", want[halfSize:]},
		{"GET", fmt.Sprintf("%s:read?offset=0&length=%d", u, 2*halfSize), "", nil},
		{"POST", u + ":truncate", "application/json", []byte(fmt.Sprintf(`{"size":"%d"}`, truncSize))},
		{"POST", u + ":fsync", "application/json", []byte(`{}`)},
		{"GET", u, "", nil},
	}
	for _, s := range steps {
		code, body, err := restCall(c, s.method, s.url, s.ctype, s.body)
		if err != nil {
			return fmt.Errorf("%s %s: %w", s.method, s.url, err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("%s %s: status %d: %s", s.method, s.url, code, body)
		}
		switch {
		case strings.Contains(s.url, ":read"):
			var r struct{ Data []byte }
			if err := json.Unmarshal(body, &r); err != nil {
				return fmt.Errorf("read %s: %w", path, err)
			}
			if !bytes.Equal(r.Data, want) {
				return fmt.Errorf("read %s: got %d bytes not the %d written", path, len(r.Data), len(want))
			}
		case s.method == "GET":
			var st struct{ Size string }
			if err := json.Unmarshal(body, &st); err != nil {
				return fmt.Errorf("stat %s: %w", path, err)
			}
			if st.Size != fmt.Sprint(truncSize) {
				return fmt.Errorf("stat %s: size %s, want %d", path, st.Size, truncSize)
			}
		}
	}
	return nil
}

func clusterPath(i int) string { return fmt.Sprintf("c/d%d/file-%03d.bin", i%7, i) }

// TestHAProxyRESTShardsByPath: through deploy/haproxy.cfg, every file lands
// whole on exactly one daemon's root and all of its verbs reach that
// daemon; once a daemon is stopped, only its files fail (503), and none of
// them is written anew on another daemon.
func TestHAProxyRESTShardsByPath(t *testing.T) {
	ds := startDaemons(t, 3)
	restAddr, _ := startHAProxy(t, ds)
	base := "http://" + restAddr
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	// After the stop, HAProxy retries a refused connection 3 times, a
	// second apart (haproxy.cfg, "retries"), so those calls take long.
	checkSharding(t, ds,
		func(i int) error { return restLifecycle(c, base, clusterPath(i), i) },
		func(i, owner, down int) error {
			u := fmt.Sprintf("%s/v1/files/%s:read?offset=0&length=%d", base, clusterPath(i), truncSize)
			code, body, err := restCall(c, "GET", u, "", nil)
			switch {
			case err != nil:
			case owner == down && code != http.StatusServiceUnavailable:
				err = fmt.Errorf("read %s of the stopped daemon: status %d, want 503: %s", clusterPath(i), code, body)
			case owner != down && code != http.StatusOK:
				err = fmt.Errorf("read %s of live daemon %d: status %d: %s", clusterPath(i), owner, code, body)
			}
			if owner == down {
				// A write to a file of the stopped daemon must not create
				// it elsewhere.
				u := fmt.Sprintf("%s/v1/files/%s?offset=0", base, clusterPath(i))
				if code, body, werr := restCall(c, "PUT", u, "application/octet-stream", []byte("x")); werr == nil && code != http.StatusServiceUnavailable {
					err = fmt.Errorf("write %s of the stopped daemon: status %d, want 503: %s", clusterPath(i), code, body)
				}
			}
			return err
		})
}

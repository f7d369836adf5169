package service

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
)

// putRaw PUTs body to url and returns an error unless the answer is 200 OK.
// It uses no *testing.T, so that a test's goroutines may call it.
func putRaw(ctx context.Context, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, "PUT", url, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return errors.New(resp.Status)
	}
	return nil
}

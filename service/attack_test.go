package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
	"github.com/filewrite/filewrite/service/internal/admit"
)

// TestStalledCallsHoldNoBudget: gRPC calls that sent their headers and
// the start of a message at the size limit, and REST JSON requests whose
// chunked body stalls, hold none of --max-inflight-bytes, however many:
// a Write at the limit, a JSON write and a health check go through past
// them, and once those are done the budget holds nothing.
func TestStalledCallsHoldNoBudget(t *testing.T) {
	const maxRequest = 64 << 10
	d := startDaemon(t, func(c *Config) {
		c.Store.MaxRequestBytes = maxRequest
		c.MaxInflightBytes = admit.MinInflightBytes(maxRequest)
	})
	ctx := testContext(t)
	budget := d.srv.budget

	calls := testutil.OpenStalledCalls(t, d.srv.grpcLis.Addr().String())
	calls.Open(t, 1, 20, filewritev1.FileService_Write_FullMethodName, maxRequest+100)
	for i := range 3 {
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() })
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s/v1/files/stalled%d:write", d.url, i), pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		if _, err := io.WriteString(pw, `{"data":"`); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: "legit.bin", Data: testutil.AllBytes(maxRequest)}); err != nil {
		t.Errorf("a Write past the stalled calls: %v", err)
	}
	if err := postJSON(ctx, d.url+"/v1/files/legit.json:write", `{"data":"aGVsbG8="}`); err != nil {
		t.Errorf("a JSON write past the stalled bodies: %v", err)
	}
	resp, err := healthpb.NewHealthClient(d.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health past the stalled calls: %v, %v", resp, err)
	}
	// A call gives its share back at its end (stats.End), which grpc-go
	// reaches after the reply is on its way: wait for it. Stalled calls
	// that held any would keep it held.
	testutil.WaitFor(t, "the budget to hold nothing with only stalled calls in flight", func() bool {
		return budget.Held() == 0
	})
}

// postJSON posts body and fails unless the answer is 200.
func postJSON(ctx context.Context, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	return nil
}

// TestCompressionBomb: a gzip-compressed Write whose data grows more
// than maxDecompressionRatio times (8 MiB of zeros, about 8 KiB
// compressed) fails before it is inflated, and writes nothing; one of
// data that compresses little goes through.
func TestCompressionBomb(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	bomb := &filewritev1.WriteRequest{Path: "zeros.bin", Data: make([]byte, 8<<20)}
	if _, err := d.client.Write(ctx, bomb, grpc.UseCompressor(gzip.Name)); status.Code(err) == codes.OK {
		t.Error("a Write of 8 MiB of zeros, gzip-compressed, went through")
	}
	if _, err := os.Stat(filepath.Join(d.root, "zeros.bin")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused Write made its file: %v", err)
	}
	plain := &filewritev1.WriteRequest{Path: "plain.bin", Data: testutil.AllBytes(256 << 10)}
	if _, err := d.client.Write(ctx, plain, grpc.UseCompressor(gzip.Name)); err != nil {
		t.Errorf("a gzip-compressed Write of data that compresses little: %v", err)
	}
}

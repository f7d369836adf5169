package e2e

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// TestDaemonGenerationAfterSIGKILL: after the daemon binary is killed and
// started again on the same root, a file changed (by gRPC and by a REST
// PUT) has a generation, and an ETag, that differs from every one handed
// out before the kill; an If-Match with a tag from before is refused.
func TestDaemonGenerationAfterSIGKILL(t *testing.T) {
	ctx, root, proc, _ := startFresh(t, 2*time.Minute)
	seen := map[int64]bool{}
	c := filewritev1.NewFileServiceClient(testutil.PlaintextConn(t, proc.GRPCAddr))
	for i := range 50 {
		w, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "g/f", Offset: int64(i), Data: []byte("x"), Sync: filewritev1.SyncMode_SYNC_MODE_DATA})
		if err != nil {
			t.Fatal(err)
		}
		seen[w.GetGeneration()] = true
	}
	if len(seen) != 50 {
		t.Fatalf("50 writes gave %d generations", len(seen))
	}
	var last int64
	for g := range seen {
		last = max(last, g)
	}
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	proc.Wait()

	restarted, logs := testutil.StartDaemon(t, ctx, daemonBin, "--root", root)
	c = filewritev1.NewFileServiceClient(testutil.PlaintextConn(t, restarted.GRPCAddr))
	w, err := c.Write(ctx, &filewritev1.WriteRequest{Path: "g/f", Data: []byte("y")})
	if err != nil {
		t.Fatalf("Write after the restart: %v\n%s", err, logs)
	}
	if seen[w.GetGeneration()] {
		t.Errorf("a write after the restart left generation %d, handed out before the kill", w.GetGeneration())
	}
	seen[w.GetGeneration()] = true
	files := "http://" + restarted.HTTPAddr + "/v1/files/"
	req, _ := http.NewRequestWithContext(ctx, "PUT", files+"g/f", strings.NewReader("z"))
	req.Header.Set("If-Match", `"`+strconv.FormatInt(last, 10)+`"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPreconditionFailed {
		t.Errorf("a PUT with If-Match of the last tag before the kill: %d, want 412", resp.StatusCode)
	}
	req, _ = http.NewRequestWithContext(ctx, "PUT", files+"g/f", strings.NewReader("z"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tag := resp.Header.Get("ETag")
	gen, err := strconv.ParseInt(strings.Trim(tag, `"`), 10, 64)
	if resp.StatusCode != 200 || err != nil || seen[gen] {
		t.Errorf("a PUT after the restart: %d, ETag %s, seen before: %v", resp.StatusCode, tag, seen[gen])
	}
}

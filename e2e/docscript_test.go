package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/filewrite/filewrite/internal/testutil"
)

// etagScriptMarker introduces the script in docs/http.md that this test
// runs as it is printed there.
const etagScriptMarker = "Right after a write, as a script:"

// statusLine finds a script line that prints its status (curl -w
// '%{http_code}') and the code its comment promises; printedStatus, a
// status at the end of a printed line.
var (
	statusLine    = regexp.MustCompile(`-w '%\{http_code\}\\n'.*#\s*(\d{3})\b`)
	printedStatus = regexp.MustCompile(`(\d{3})$`)
)

// TestHTTPDocETagScript runs docs/http.md's precondition script, pasted
// as it is, against the daemon right after the write it starts with (no
// second waited for: the tags come from generations), and checks that
// every status the script prints is the one its comment promises.
func TestHTTPDocETagScript(t *testing.T) {
	for _, tool := range []string{"curl", "bash", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "http.md"))
	if err != nil {
		t.Fatal(err)
	}
	script := docScriptAfter(t, string(doc), etagScriptMarker)
	var want []string
	for _, line := range strings.Split(script, "\n") {
		if m := statusLine.FindStringSubmatch(line); m != nil {
			want = append(want, m[1])
		}
	}
	if len(want) < 4 {
		t.Fatalf("docs/http.md's script promises %d statuses; want the script with its commented codes:\n%s", len(want), script)
	}

	ctx, root, proc, logs := startFresh(t, 2*time.Minute)
	dir := testutil.Dir(t)
	if err := os.WriteFile(filepath.Join(dir, "raw.bin"), allBytes(8192), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "patch.bin"), bytes.Repeat([]byte{'p'}, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -e -o pipefail\n"+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FILES=http://"+proc.HTTPAddr+"/v1/files")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the script failed: %v\nstdout:\n%s\nstderr:\n%s\ndaemon:\n%s", err, out, stderr.Bytes(), logs)
	}
	// The first PUT prints its JSON reply without a newline, so a status
	// may follow it on the same line: the statuses are the lines' ends.
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if m := printedStatus.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			got = append(got, m[1])
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the script printed statuses %v, its comments promise %v\nstdout:\n%s", got, want, out)
	}
	t.Logf("the script printed statuses %v, as its comments promise", got)
	// Its first PUT, promised 201, prints its reply instead of a status:
	// a PUT that made the file says so there.
	if !strings.Contains(string(out), `"created":true`) {
		t.Errorf("the script's first PUT did not answer that it created the file (201):\n%s", out)
	}
	if got, err := os.ReadFile(filepath.Join(root, "demo", "raw.bin")); err != nil || len(got) != 8192 || got[4096] != 'p' {
		t.Fatalf("after the script the file is %d bytes (%v); want the 8192 written with the one patch that held at 4096", len(got), err)
	}
}

// docScriptAfter returns the first ```sh block after marker in doc.
func docScriptAfter(t *testing.T, doc, marker string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, marker)
	if !ok {
		t.Fatalf("docs/http.md no longer says %q before its script", marker)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatalf("no ```sh block after %q", marker)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("the script after %q does not end", marker)
	}
	return block
}

package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// TestFilesChangedOutside: the root is the daemon's. A file removed from
// under it (rm) or replaced (mv new f) while open is noticed at its next
// sync, which is DATA_LOSS naming the cause rather than OK for data that
// went to a file no name reaches, or at its next Stat; after that the path
// is served as it is on disk.
func TestFilesChangedOutside(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := testContext(t)
	dataSync := filewritev1.SyncMode_SYNC_MODE_DATA
	write := func(path, data string) error {
		_, err := d.client.Write(ctx, &filewritev1.WriteRequest{Path: path, Data: []byte(data), Sync: dataSync})
		return err
	}
	if err := write("removed", "first"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(d.root, "removed")); err != nil {
		t.Fatal(err)
	}
	err := write("removed", "lost")
	if status.Code(err) != codes.DataLoss || !strings.Contains(status.Convert(err).Message(), "removed or replaced from outside") {
		t.Errorf("a synced Write after rm: %v, want DATA_LOSS that says why", err)
	}
	if err := write("removed", "again"); err != nil {
		t.Fatalf("a Write once the daemon noticed: %v", err)
	}
	if got := d.onDisk(t, "removed"); string(got) != "again" {
		t.Errorf("removed = %q on disk, want \"again\"", got)
	}

	if err := write("replaced", "old contents"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.root, "new"), []byte("NEW"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(d.root, "new"), filepath.Join(d.root, "replaced")); err != nil {
		t.Fatal(err)
	}
	if st, err := d.client.Stat(ctx, &filewritev1.StatRequest{Path: "replaced"}); err != nil || st.GetSize() != 3 {
		t.Errorf("Stat after mv over the file: %v, %v; want the new file's size 3", st, err)
	}
	if r, err := d.client.Read(ctx, &filewritev1.ReadRequest{Path: "replaced", Length: 64}); err != nil || string(r.GetData()) != "NEW" {
		t.Errorf("Read after mv over the file: %v, %v; want \"NEW\"", r, err)
	}
}

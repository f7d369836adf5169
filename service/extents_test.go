package service

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/testutil"
)

// makeStriped makes a file of n preallocated (unwritten) 4 KiB blocks,
// each followed by a hole of one block, behind the daemon's back: 2n
// extents. Preallocated rather than written, so that no data has to reach
// the disk before the daemon maps the file.
func makeStriped(t *testing.T, d *daemon, name string, n int) {
	t.Helper()
	f, err := os.Create(filepath.Join(d.root, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range n {
		if err := unix.Fallocate(int(f.Fd()), 0, int64(2*i)*4096, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(int64(2*n) * 4096); err != nil {
		t.Fatal(err)
	}
}

// wantStriped is what Extents says of makeStriped's file.
func wantStriped(n int) []*filewritev1.Extent {
	var out []*filewritev1.Extent
	for i := range n {
		out = append(out,
			&filewritev1.Extent{Offset: int64(2*i) * 4096, Length: 4096, State: filewritev1.ExtentState_EXTENT_STATE_UNWRITTEN},
			&filewritev1.Extent{Offset: int64(2*i+1) * 4096, Length: 4096, State: filewritev1.ExtentState_EXTENT_STATE_HOLE})
	}
	return out
}

func sameExtents(got, want []*filewritev1.Extent) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d extents, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].GetOffset() != want[i].GetOffset() || got[i].GetLength() != want[i].GetLength() || got[i].GetState() != want[i].GetState() {
			return fmt.Sprintf("extent %d is %v, want %v", i, got[i], want[i])
		}
	}
	return ""
}

// allPagesGRPC follows next_page_token to the end and returns every extent
// and the size of each page.
func allPagesGRPC(t *testing.T, d *daemon, req *filewritev1.ExtentsRequest) ([]*filewritev1.Extent, []int) {
	t.Helper()
	var exts []*filewritev1.Extent
	var sizes []int
	for {
		resp, err := d.client.Extents(testContext(t), req)
		if err != nil {
			t.Fatalf("Extents(%v) after %d pages: %v", req, len(sizes), err)
		}
		exts = append(exts, resp.GetExtents()...)
		sizes = append(sizes, len(resp.GetExtents()))
		if resp.GetNextPageToken() == "" {
			return exts, sizes
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// TestExtentsPagesGRPC: Extents answers at most page_size extents (1000 by
// default, 10000 at most), and next_page_token resumes after the last one,
// until the whole range is listed.
func TestExtentsPagesGRPC(t *testing.T) {
	d := startDaemon(t, nil)
	makeStriped(t, d, "striped", 1100) // 2200 extents
	want := wantStriped(1100)
	for _, tt := range []struct {
		pageSize  int32
		wantSizes []int
	}{
		{0, []int{1000, 1000, 200}},
		{999, []int{999, 999, 202}},
		{10000, []int{2200}},
		{2200, []int{2200}},
		{2199, []int{2199, 1}},
	} {
		got, sizes := allPagesGRPC(t, d, &filewritev1.ExtentsRequest{Path: "striped", PageSize: tt.pageSize})
		if d := sameExtents(got, want); d != "" {
			t.Errorf("page_size %d: %s", tt.pageSize, d)
		}
		if fmt.Sprint(sizes) != fmt.Sprint(tt.wantSizes) {
			t.Errorf("page_size %d: pages of %v, want %v", tt.pageSize, sizes, tt.wantSizes)
		}
	}
	// A range, in pages of 3.
	got, _ := allPagesGRPC(t, d, &filewritev1.ExtentsRequest{Path: "striped", Offset: 4096 * 10, Length: 4096 * 20, PageSize: 3})
	if d := sameExtents(got, want[10:30]); d != "" {
		t.Errorf("a range in pages of 3: %s", d)
	}
}

// TestExtentsPagesRefused: a page size out of bounds, and a token that is
// not one this request's first page could lead to, are INVALID_ARGUMENT,
// naming what is wrong.
func TestExtentsPagesRefused(t *testing.T) {
	d := startDaemon(t, nil)
	makeStriped(t, d, "striped", 20)
	makeStriped(t, d, "other", 20)
	first, err := d.client.Extents(testContext(t), &filewritev1.ExtentsRequest{Path: "striped", Length: 4096 * 30, PageSize: 5})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, %v; want a next page", first, err)
	}
	tok := first.GetNextPageToken()
	for _, tt := range []struct {
		name string
		req  *filewritev1.ExtentsRequest
		msg  string
	}{
		{"page size over the maximum", &filewritev1.ExtentsRequest{Path: "striped", PageSize: 10001}, "10000"},
		{"negative page size", &filewritev1.ExtentsRequest{Path: "striped", PageSize: -1}, "page_size"},
		{"token of another path", &filewritev1.ExtentsRequest{Path: "other", Length: 4096 * 30, PageSize: 5, PageToken: tok}, "page_token"},
		{"token of another length", &filewritev1.ExtentsRequest{Path: "striped", Length: 4096 * 31, PageSize: 5, PageToken: tok}, "page_token"},
		{"token of another offset", &filewritev1.ExtentsRequest{Path: "striped", Offset: 1, Length: 4096 * 30, PageSize: 5, PageToken: tok}, "page_token"},
		{"token not base64", &filewritev1.ExtentsRequest{Path: "striped", PageToken: "not a token!"}, "page_token"},
		{"token cut short", &filewritev1.ExtentsRequest{Path: "striped", Length: 4096 * 30, PageToken: tok[:len(tok)-3]}, "page_token"},
	} {
		_, err := d.client.Extents(testContext(t), tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %s", tt.name, err, tt.msg)
		}
	}
	// The same token with a different page size is fine.
	if _, err := d.client.Extents(testContext(t), &filewritev1.ExtentsRequest{Path: "striped", Length: 4096 * 30, PageSize: 7, PageToken: tok}); err != nil {
		t.Errorf("the token with another page size: %v", err)
	}
}

// TestExtentsPagesFitTheMessageLimit: with a small --max-request-bytes, a
// page of the maximum size would not fit in a gRPC message: the daemon
// answers fewer extents rather than fail, and the pages still add up.
func TestExtentsPagesFitTheMessageLimit(t *testing.T) {
	d := startDaemon(t, func(c *Config) { c.Store.MaxRequestBytes = 1 })
	makeStriped(t, d, "striped", 3000) // 6000 extents, 70 KiB or more on the wire
	got, sizes := allPagesGRPC(t, d, &filewritev1.ExtentsRequest{Path: "striped", PageSize: 10000})
	if d := sameExtents(got, wantStriped(3000)); d != "" {
		t.Errorf("%s (pages of %v)", d, sizes)
	}
	if len(sizes) < 2 {
		t.Errorf("one page of %d extents under a 64 KiB message limit", sizes[0])
	}
}

// TestExtentsPagesREST: the same over the gateway, with pageSize and
// pageToken in the query and nextPageToken in the JSON reply.
func TestExtentsPagesREST(t *testing.T) {
	d := startDaemon(t, nil)
	makeStriped(t, d, "striped", 30)
	var got []*filewritev1.Extent
	var sizes []int
	next := ""
	for pages := 0; ; pages++ {
		q := url.Values{"pageSize": {"25"}}
		if pages%2 == 1 {
			q = url.Values{"page_size": {"25"}} // the proto name works too
		}
		if next != "" {
			q.Set("pageToken", next)
		}
		r := testutil.DoHTTP(t, "GET", d.url+"/v1/files/striped:extents?"+q.Encode(), nil, nil)
		if r.Status != 200 {
			t.Fatalf("page %d: %d %s", pages, r.Status, r.Body)
		}
		var resp struct {
			Extents []struct {
				Offset, Length string
				State          string
			}
			NextPageToken string
		}
		if err := json.Unmarshal(r.Body, &resp); err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.Extents {
			var off, n int64
			fmt.Sscan(e.Offset, &off)
			fmt.Sscan(e.Length, &n)
			got = append(got, &filewritev1.Extent{Offset: off, Length: n, State: filewritev1.ExtentState(filewritev1.ExtentState_value[e.State])})
		}
		sizes = append(sizes, len(resp.Extents))
		if next = resp.NextPageToken; next == "" {
			break
		}
	}
	if d := sameExtents(got, wantStriped(30)); d != "" {
		t.Errorf("%s", d)
	}
	if fmt.Sprint(sizes) != "[25 25 10]" {
		t.Errorf("pages of %v, want [25 25 10]", sizes)
	}
	r := testutil.DoHTTP(t, "GET", d.url+"/v1/files/striped:extents?pageSize=10001", nil, nil)
	if e := testutil.ParseErrorBody(t, r); r.Status != 400 || !strings.Contains(e.Message, "10000") {
		t.Errorf("pageSize=10001: %d %+v, want 400 naming the maximum", r.Status, e)
	}
}

package webdav

import (
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
	"testing"

	xwebdav "golang.org/x/net/webdav"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/service/internal/status"
	"github.com/filewrite/filewrite/store"
)

func TestClean(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/", ""},
		{"", ""},
		{"/a/b/", "a/b"},
		{"/a//b/../c", "a/c"},
		{"/../a", "a"},
	} {
		if got := clean(tc.in); got != tc.want {
			t.Errorf("clean(%q): got %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestDeadProps: PROPPATCH's sets and removes apply in order, and the
// properties survive their encoding into the attribute whole.
func TestDeadProps(t *testing.T) {
	a := xml.Name{Space: "urn:x", Local: "a"}
	b := xml.Name{Space: "", Local: "b"}
	m, ok := applyPatches(nil, []xwebdav.Proppatch{
		{Props: []xwebdav.Property{{XMLName: a, Lang: "en", InnerXML: []byte("<y:v xmlns:y=\"urn:y\">1</y:v>")}, {XMLName: b, InnerXML: []byte("two")}}},
		{Remove: true, Props: []xwebdav.Property{{XMLName: b}}},
	})
	if ok.Status != http.StatusOK || len(ok.Props) != 3 {
		t.Errorf("propstat: %+v, want 200 for the three instructions", ok)
	}
	got, err := decodeProps(encodeProps(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[a].Lang != "en" || string(got[a].InnerXML) != "<y:v xmlns:y=\"urn:y\">1</y:v>" {
		t.Errorf("after the round trip: %+v", got)
	}
	if encodeProps(map[xml.Name]xwebdav.Property{}) != nil {
		t.Errorf("no properties encode to something: the attribute would stay")
	}
	failed := failedPatch([]xwebdav.Proppatch{{Props: []xwebdav.Property{{XMLName: a}, {XMLName: b}}}}, http.StatusForbidden)
	if len(failed) != 1 || failed[0].Status != http.StatusForbidden || len(failed[0].Props) != 2 {
		t.Errorf("failedPatch: %+v", failed)
	}
}

// TestFailure: the status a refusal is answered with, as the other routes
// answer it, and 507 where WebDAV has it.
func TestFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{status.Refusal(filewritev1.ErrorReason_PERMISSION_DENIED_SCOPE, nil, "no"), http.StatusForbidden},
		{fmt.Errorf("%w: x", store.ErrInvalidPath), http.StatusBadRequest},
		{fmt.Errorf("%w: x", store.ErrNoSpace), http.StatusInsufficientStorage},
		{fmt.Errorf("%w: x", store.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("%w: listing", errTooMany), http.StatusInsufficientStorage},
		{grpcstatus.Error(codes.Unauthenticated, "who?"), http.StatusUnauthorized},
		{errors.New("something else"), http.StatusInternalServerError},
	} {
		if got, _ := failure(tc.err); got != tc.want {
			t.Errorf("failure(%v): got %d, want %d", tc.err, got, tc.want)
		}
	}
}

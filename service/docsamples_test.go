package service

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// docSample is a response body that a page of docs/ shows for a request:
// a ```json block right after a comment "<!-- body of: METHOD PATH -->".
type docSample struct {
	where        string // file:line of the comment
	method, path string
	body         string
}

// readDocSamples collects the samples of every page of docs/.
func readDocSamples(t *testing.T) []docSample {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var samples []docSample
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		var cur *docSample
		inBlock := false
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			switch {
			case cur == nil:
				rest, ok := strings.CutPrefix(line, "<!-- body of: ")
				if !ok {
					continue
				}
				method, path, _ := strings.Cut(strings.TrimSuffix(rest, " -->"), " ")
				cur = &docSample{where: filepath.Base(page) + ":" + strconv.Itoa(n), method: method, path: path}
			case !inBlock && line == "```json":
				inBlock = true
			case !inBlock:
				t.Fatalf("%s: the sample's comment is not followed by a ```json block", cur.where)
			case line == "```":
				samples = append(samples, *cur)
				cur, inBlock = nil, false
			default:
				cur.body += line + "\n"
			}
		}
	}
	return samples
}

// TestDocSampleBodies: the response bodies the docs show are those the
// daemon sends, to the byte's meaning (JSON compared as values: the
// spacing of protojson's output is not stable).
func TestDocSampleBodies(t *testing.T) {
	samples := readDocSamples(t)
	if len(samples) == 0 {
		t.Fatal("no <!-- body of: ... --> sample found in docs/")
	}
	d := startDaemon(t, nil)
	for _, s := range samples {
		t.Run(s.where, func(t *testing.T) {
			_, got := send(t, s.method, d.url+s.path, nil, nil)
			var gotV, wantV any
			if err := json.Unmarshal(got, &gotV); err != nil {
				t.Fatalf("%s %s answered %s, not JSON: %v", s.method, s.path, got, err)
			}
			if err := json.Unmarshal([]byte(s.body), &wantV); err != nil {
				t.Fatalf("the sample is not JSON: %v\n%s", err, s.body)
			}
			if !reflect.DeepEqual(gotV, wantV) {
				t.Errorf("%s %s answers\n%s\nthe docs show\n%s", s.method, s.path, got, s.body)
			}
		})
	}
}

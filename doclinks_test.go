package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinksResolve checks every relative link of README.md and docs/:
// the file or directory it names exists, and an anchor (#...) names a
// heading of that page, spelled as GitHub spells it. Pages move between
// README and docs/ often; a link that points nowhere is found here, not by
// a reader.
func TestDocLinksResolve(t *testing.T) {
	pages := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := filepath.Glob(filepath.Join("docs", "*", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(append(pages, more...), sub...)

	anchors := map[string]map[string]bool{} // page -> its heading anchors
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[page] = a
		return a
	}

	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, link := range relativeLinks(string(b)) {
			checked++
			target, anchor, _ := strings.Cut(link, "#")
			file := page
			if target != "" {
				file = filepath.Join(filepath.Dir(page), filepath.FromSlash(target))
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: %v", page, link, err)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			if !anchorsOf(file)[anchor] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", page, link, file, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the link pattern is broken")
	}
}

// linkPattern matches an inline Markdown link's target: [text](target).
var linkPattern = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// relativeLinks returns the targets of the inline links outside code blocks
// and code spans that name no scheme (http:, mailto:, ...).
func relativeLinks(md string) []string {
	var links []string
	fence := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range linkPattern.FindAllStringSubmatch(stripCodeSpans(line), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, target)
		}
	}
	return links
}

// stripCodeSpans blanks `code spans`, whose brackets are not links.
func stripCodeSpans(line string) string {
	var b strings.Builder
	in := false
	for _, r := range line {
		if r == '`' {
			in = !in
			continue
		}
		if !in {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// headingAnchors returns the anchors GitHub gives a page's headings:
// lower case, punctuation but '-' and '_' dropped, spaces turned into '-',
// and "-1", "-2", ... after a repeated one.
func headingAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for line := range strings.Lines(md) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a += "-" + strconv.Itoa(n)
		} else {
			seen[a] = 1
		}
		anchors[a] = true
	}
	return anchors
}

// TestBenchmarkRecordsAreLinked checks that docs/benchmarks.md links every
// record in docs/benchmarks/, so that a run committed there is findable.
func TestBenchmarkRecordsAreLinked(t *testing.T) {
	records, err := filepath.Glob(filepath.Join("docs", "benchmarks", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join("docs", "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, l := range relativeLinks(string(page)) {
		target, _, _ := strings.Cut(l, "#")
		linked[filepath.Join("docs", filepath.FromSlash(target))] = true
	}
	for _, r := range records {
		if !linked[r] {
			t.Errorf("docs/benchmarks.md does not link the record %s", r)
		}
	}
}

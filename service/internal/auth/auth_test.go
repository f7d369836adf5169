package auth

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

const (
	tokenAlpha = "alpha-7f3c9b1e"
	tokenBeta  = "beta-2d8e4a60"
)

func TestTokenCheck(t *testing.T) {
	dir := testutil.Dir(t)
	file := filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, []byte("# operators\n\n  "+tokenAlpha+"  \r\n"+tokenBeta+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := NewTokens(file, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		values []string
		want   error
	}{
		{"none", nil, errNoToken},
		{"first token", []string{"Bearer " + tokenAlpha}, nil},
		{"second token, blanks around", []string{"  Bearer   " + tokenBeta + " "}, nil},
		{"scheme in lower case", []string{"bearer " + tokenAlpha}, nil},
		{"wrong token", []string{"Bearer gamma"}, errBadToken},
		{"prefix of a token", []string{"Bearer " + tokenAlpha[:5]}, errBadToken},
		{"token with a suffix", []string{"Bearer " + tokenAlpha + "x"}, errBadToken},
		{"empty token", []string{"Bearer "}, errNotBearerToken},
		{"comment line as a token", []string{"Bearer #"}, errBadToken},
		{"no scheme", []string{tokenAlpha}, errNotBearerToken},
		{"basic scheme", []string{"Basic " + tokenAlpha}, errNotBearerToken},
		{"two values, both valid", []string{"Bearer " + tokenAlpha, "Bearer " + tokenBeta}, errManyTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, got := a.check(tt.values); got != tt.want {
				t.Errorf("check(%q) = %v, want %v", tt.values, got, tt.want)
			}
		})
	}
}

func TestTokenFileRejects(t *testing.T) {
	dir := testutil.Dir(t)
	tests := []struct {
		name, contents, want string
	}{
		{"empty", "", "holds no token"},
		{"comments only", "# nothing yet\n\n", "holds no token"},
		{"blank inside a token", "alpha beta\n", "line 1: malformed scope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, "tokens")
			if err := os.WriteFile(file, []byte(tt.contents), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewTokens(file, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("newTokenAuth(%q) = %v, want an error containing %q", tt.contents, err, tt.want)
			}
		})
	}
	if _, err := NewTokens(filepath.Join(dir, "missing"), slog.New(slog.DiscardHandler)); err == nil {
		t.Error("newTokenAuth of a missing file succeeded")
	}
}

func TestParseScopeWords(t *testing.T) {
	tests := []struct {
		words    string
		want     *scope // nil: refused
		wantErr  string
		covers   []string
		excludes []string
	}{
		{words: "", want: &scope{}},
		{words: "name=job-7 prefix=ckpt/job-7/ mode=rw", want: &scope{name: "job-7", prefixes: []string{"ckpt/job-7"}},
			covers: []string{"ckpt/job-7", "ckpt/job-7/a", "ckpt/job-7/a/b"}, excludes: []string{"ckpt/job-70", "ckpt", "ckpt/job-8/a", "."}},
		{words: "prefix=a prefix=b/c mode=ro", want: &scope{prefixes: []string{"a", "b/c"}, readOnly: true},
			covers: []string{"a/x", "b/c/d"}, excludes: []string{"ab", "b", "b/cd"}},
		{words: "prefix=a prefix=a/", want: &scope{prefixes: []string{"a"}}},
		{words: "prefix=", wantErr: "is empty"},
		{words: "prefix=.", wantErr: "is empty"},
		{words: "prefix=/etc", wantErr: "is absolute"},
		{words: "prefix=../x", wantErr: "leaves --root"},
		{words: "prefix=a/../b", wantErr: "not a clean path"},
		{words: "prefix=a//b", wantErr: "not a clean path"},
		{words: "prefix=..", wantErr: "leaves --root"},
		{words: "mode=rwx", wantErr: "want rw or ro"},
		{words: "mode=ro mode=rw", wantErr: "given twice"},
		{words: "owner=bob", wantErr: `unknown key "owner"`},
		{words: "second-token", wantErr: "is not key=value"},
	}
	for _, tt := range tests {
		t.Run(tt.words, func(t *testing.T) {
			got, err := parseScopeWords(strings.Fields(tt.words), 3)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseScopeWords(%q) = %v, want an error containing %q", tt.words, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseScopeWords(%q): %v", tt.words, err)
			}
			if got.name != tt.want.name || got.readOnly != tt.want.readOnly || !slices.Equal(got.prefixes, tt.want.prefixes) {
				t.Errorf("parseScopeWords(%q) = %+v, want %+v", tt.words, got, tt.want)
			}
			for _, p := range tt.covers {
				if !got.covers(p) {
					t.Errorf("scope %q does not cover %q, want it to", tt.words, p)
				}
			}
			for _, p := range tt.excludes {
				if got.covers(p) {
					t.Errorf("scope %q covers %q, want it not to", tt.words, p)
				}
			}
		})
	}
}

func TestTokenFileScopeErrorsNameTheLine(t *testing.T) {
	dir := testutil.Dir(t)
	file := testutil.WriteTokenFile(t, dir, "tokens", "# header", "good name=a prefix=a/", "bad prefix=../up")
	_, err := NewTokens(file, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("newTokenAuth = %v, want an error naming line 3", err)
	}
	// A reload with the bad line keeps the credentials in force.
	good := testutil.WriteTokenFile(t, dir, "good", "good name=a prefix=a/")
	a, err := NewTokens(good, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("good prefix=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("reload of a bad file = %v, want an error naming line 1", err)
	}
	if id, err := a.check([]string{"Bearer good"}); err != nil || a.scopeOf(id).name != "a" {
		t.Errorf("after a refused reload: check = %v, want the old credential still in force", err)
	}
}

// TestTokensExample: the token file of docker-compose.yml's tenants
// profile loads, and its scopes are the ones its comments describe.
func TestTokensExample(t *testing.T) {
	c, err := readCredentials(filepath.Join("..", "..", "..", "deploy", "tokens.example"))
	if err != nil {
		t.Fatal(err)
	}
	a := &Tokens{log: slog.New(slog.DiscardHandler)}
	a.creds.Store(c)
	for _, tt := range []struct {
		token, path string
		acc         access
		want        bool
	}{
		{"example-operator-token", "tenants/b/x", AccessWrite, true},
		{"example-team-a-token", "tenants/a/x", AccessWrite, true},
		{"example-team-a-token", "tenants/b/x", AccessRead, false},
		{"example-team-b-token", "tenants/b/x", AccessWrite, true},
		{"example-audit-a-token", "tenants/a/x", AccessRead, true},
		{"example-audit-a-token", "tenants/a/x", AccessWrite, false},
	} {
		id, err := a.check([]string{"Bearer " + tt.token})
		if err != nil {
			t.Fatalf("%s: %v", tt.token, err)
		}
		if got := a.scopeOf(id).allows(tt.path, tt.acc); got != tt.want {
			t.Errorf("%s may %v %s: %v, want %v", tt.token, tt.acc, tt.path, got, tt.want)
		}
	}
}

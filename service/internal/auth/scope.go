package auth

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// A scope is what one credential of --auth-token-file may reach: the files
// below its prefixes (every file when it has none), for reading only or for
// reading and writing. It follows the stores that scope credentials to a
// name prefix and an access mode (GCS IAM conditions on object name
// prefixes, S3 bucket policies on key prefixes).
//
// A scope is immutable once parsed: a reload builds new ones.
type scope struct {
	// name labels the credential in logs, never the token itself; ""
	// when the line gave none (logs then say "line N").
	name string
	// line is the credential's line in the token file.
	line int
	// prefixes are clean relative directory paths (no trailing slash);
	// none means every path below --root.
	prefixes []string
	// readOnly is mode=ro.
	readOnly bool
}

// access is what an operation does to a path.
type access int

const (
	// AccessRead: Read, Stat, Extents, Digest, List, downloads; NBD's reads.
	AccessRead access = iota
	// AccessWrite: Write, WriteStream, Truncate, Fallocate, Fsync,
	// Delete, both paths of a Rename; NBD's writes, trims and zeroes.
	AccessWrite
)

func (a access) String() string {
	if a == AccessWrite {
		return "write"
	}
	return "read"
}

// admin reports whether the scope reaches everything: no prefix and
// mode=rw, as a line without scope words. Only an admin credential sees
// other tenants' paths (GET /debug/locks).
func (sc *scope) admin() bool {
	return sc != nil && len(sc.prefixes) == 0 && !sc.readOnly
}

// label names the credential in a log line.
func (sc *scope) label() string {
	if sc.name != "" {
		return sc.name
	}
	return fmt.Sprintf("line %d", sc.line)
}

// covers reports whether p, a clean relative path, lies in one of the
// scope's directories. A prefix names a directory: "a" covers "a" and
// "a/b", never "ab".
func (sc *scope) covers(p string) bool {
	if len(sc.prefixes) == 0 {
		return true
	}
	for _, pre := range sc.prefixes {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// allows reports whether the scope permits a on p (a clean relative path).
func (sc *scope) allows(p string, a access) bool {
	if a == AccessWrite && sc.readOnly {
		return false
	}
	return sc.covers(p)
}

// listable reports whether a List of dir (a clean relative path, "." for
// --root itself) is allowed, and if so whether its entries must be
// filtered: a directory the scope covers lists whole; an ancestor of one
// of its prefixes lists only the entries that lead to a prefix, so that a
// tenant can walk down from --root to its own files and sees no other
// tenant's names.
func (sc *scope) listable(dir string) (ok, filtered bool) {
	if dir == "." || dir == "" {
		return true, len(sc.prefixes) > 0
	}
	if sc.covers(dir) {
		return true, false
	}
	for _, pre := range sc.prefixes {
		if strings.HasPrefix(pre, dir+"/") {
			return true, true
		}
	}
	return false, false
}

// leadsTo reports whether the entry name of directory dir (as listable
// filtered it) is on the way to, or inside, one of the scope's prefixes.
func (sc *scope) leadsTo(dir, name string) bool {
	p := name
	if dir != "." && dir != "" {
		p = dir + "/" + name
	}
	if sc.covers(p) {
		return true
	}
	for _, pre := range sc.prefixes {
		if strings.HasPrefix(pre, p+"/") {
			return true
		}
	}
	return false
}

// cleanScopePath is p as scopes compare it: slash-separated, relative to
// --root, cleaned ("a/./b" and "a//b/" are "a/b"; "" is "."). It fails for
// a path that leaves --root ("..", "/abs"): the store refuses those too, and
// a scope must not be asked about them.
func cleanScopePath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is absolute: paths are relative to --root", p)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %q leaves --root", p)
	}
	return c, nil
}

// errScopeSyntax is returned (wrapped, with the line) for a token-file line
// whose scope words are malformed.
var errScopeSyntax = errors.New("malformed scope")

// parseScopeWords parses the words after a line's credential: name=LABEL,
// prefix=DIR (repeatable), mode=rw|ro. A prefix must be a clean relative
// directory (a trailing slash is allowed and dropped); "", ".", "..", an
// absolute path or one with "." or ".." elements is refused, as is an
// unknown key or a repeated name or mode.
func parseScopeWords(words []string, line int) (*scope, error) {
	sc := &scope{line: line}
	var sawName, sawMode bool
	for _, w := range words {
		key, val, ok := strings.Cut(w, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %q is not key=value (keys: name, prefix, mode, cert)", errScopeSyntax, w)
		}
		switch key {
		case "name":
			if sawName || val == "" {
				return nil, fmt.Errorf("%w: name= given twice or empty", errScopeSyntax)
			}
			sawName, sc.name = true, val
		case "mode":
			if sawMode {
				return nil, fmt.Errorf("%w: mode= given twice", errScopeSyntax)
			}
			sawMode = true
			switch val {
			case "rw":
			case "ro":
				sc.readOnly = true
			default:
				return nil, fmt.Errorf("%w: mode=%q (want rw or ro)", errScopeSyntax, val)
			}
		case "prefix":
			pre, err := parsePrefix(val)
			if err != nil {
				return nil, err
			}
			if !slices.Contains(sc.prefixes, pre) {
				sc.prefixes = append(sc.prefixes, pre)
			}
		default:
			return nil, fmt.Errorf("%w: unknown key %q (keys: name, prefix, mode, cert)", errScopeSyntax, key)
		}
	}
	return sc, nil
}

// parsePrefix checks one prefix= value: a directory below --root, written
// cleanly.
func parsePrefix(val string) (string, error) {
	v := strings.TrimSuffix(val, "/")
	switch {
	case v == "" || v == ".":
		return "", fmt.Errorf("%w: prefix=%q is empty: leave prefix out to reach every file", errScopeSyntax, val)
	case strings.HasPrefix(v, "/"):
		return "", fmt.Errorf("%w: prefix=%q is absolute: prefixes are relative to --root", errScopeSyntax, val)
	case path.Clean(v) != v:
		return "", fmt.Errorf("%w: prefix=%q is not a clean path (no \".\", \"..\" or empty elements)", errScopeSyntax, val)
	case v == ".." || strings.HasPrefix(v, "../"):
		return "", fmt.Errorf("%w: prefix=%q leaves --root", errScopeSyntax, val)
	}
	return v, nil
}

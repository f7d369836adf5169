package service

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// buildVersion and buildCommit override what the binary's build info says,
// for builds that have no VCS information to stamp (a Docker build without
// .git): go build -ldflags "-X
// github.com/filewrite/filewrite/service.buildVersion=v1.2.3 -X
// github.com/filewrite/filewrite/service.buildCommit=abc123".
var buildVersion, buildCommit string

// BuildInfo says which build of the daemon runs: --version prints it, the
// filewrite_build_info gauge carries it as labels, and the start log has it.
type BuildInfo struct {
	// Version is the main module's version: a tag or pseudo-version when
	// built with `go install module@version` or from a tagged checkout,
	// "(devel)" from a plain checkout.
	Version string
	// Commit is the VCS revision the binary was built from, with
	// "-modified" when the tree had uncommitted changes; "unknown" when the
	// build recorded none (-buildvcs=false, no .git).
	Commit string
	// GoVersion is the toolchain that built it, as runtime.Version says.
	GoVersion string
}

// ReadBuildInfo reads the build information that the Go toolchain stamped
// into the binary (runtime/debug.ReadBuildInfo), with the -ldflags
// overrides above.
func ReadBuildInfo() BuildInfo {
	b := BuildInfo{Version: "(devel)", Commit: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v := info.Main.Version; v != "" {
			b.Version = v
		}
		var rev, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			b.Commit = rev
			if modified == "true" {
				b.Commit += "-modified"
			}
		}
	}
	if buildVersion != "" {
		b.Version = buildVersion
	}
	if buildCommit != "" {
		b.Commit = buildCommit
	}
	return b
}

// String is --version's line.
func (b BuildInfo) String() string {
	return fmt.Sprintf("filewrite %s, commit %s, %s %s/%s", b.Version, b.Commit, b.GoVersion, runtime.GOOS, runtime.GOARCH)
}

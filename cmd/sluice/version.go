package main

import (
	"runtime/debug"
	"strings"
)

// version is set at link time by release builds (-ldflags "-X
// main.version=v1.2.3"); otherwise the build's own information says it.
var version = "dev"

// versionString is the version and what the build knows of its source:
//
//	v1.2.3
//	v0.0.0-20261201231000-0123456789ab+dirty (revision 0123456789ab, 2026-12-01T23:10:00Z, modified)
//
// go build embeds the module version (a tag, or a pseudo-version from the
// commit) and the VCS revision, its time and whether the tree was modified.
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version
	}
	return describeBuild(version, bi)
}

// describeBuild is versionString for the linked version v and build
// information bi.
func describeBuild(v string, bi *debug.BuildInfo) string {
	if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	parts := []string{"revision " + rev}
	if at != "" {
		parts = append(parts, at)
	}
	if modified {
		parts = append(parts, "modified")
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}

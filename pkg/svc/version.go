package svc

import (
	"runtime/debug"
	"strings"
)

// stamped is set at link time by make build (-X, from git describe): Go
// does not stamp the commit into binaries built in a workspace.
var stamped string

// Version says which build this is: what make build stamped (git
// describe: the commit, "-dirty" with changes), else the module's version and the commit
// Go stamped into the binary when it was built from a checkout, e.g.
// "(devel) 3f2a9c1b7d4e 2026-11-24T15:30:00Z" (with "+dirty" when the
// checkout had changes). Operators compare it across processes during a
// rolling upgrade (docs/upgrades.md).
func Version() string {
	if stamped != "" {
		return stamped
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return versionOf(bi)
}

func versionOf(bi *debug.BuildInfo) string {
	parts := []string{bi.Main.Version}
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+dirty"
		}
		parts = append(parts, rev)
	}
	if at != "" {
		parts = append(parts, at)
	}
	return strings.Join(parts, " ")
}

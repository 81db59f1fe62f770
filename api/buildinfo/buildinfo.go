// Package buildinfo is the one source of the build's version and revision:
// `eventpipe version`, the OCSF metadata.product.version, the Kafka record
// headers and every user agent read it here, so they cannot disagree.
//
// The release build stamps both at link time (deploy/image):
//
//	-X github.com/eventpipe/eventpipe/api/buildinfo.version=<version>
//	-X github.com/eventpipe/eventpipe/api/buildinfo.revision=<commit>
//
// A plain `go build` leaves them empty; the module's build information
// then stands in (the module version of `go install ...@v1.2.3`, the VCS
// revision of a build from a checkout), else "dev" and "unknown".
package buildinfo

import (
	"runtime/debug"
	"sync"
)

// Stamped at link time; see the package doc.
var (
	version  string
	revision string
)

var info = sync.OnceValues(func() (string, string) {
	v, r := version, revision
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && r == "" {
				r = s.Value
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if r == "" {
		r = "unknown"
	}
	return v, r
})

// Version is the build's version: the stamped release version, else the
// module version, else "dev".
func Version() string { v, _ := info(); return v }

// Revision is the commit the build was made from, else "unknown".
func Revision() string { _, r := info(); return r }

// UserAgent is the User-Agent (or client name) of one part of eventpipe:
// "eventpipe-<part>/<version>", e.g. "eventpipe-loki-sink/1.4.0".
func UserAgent(part string) string { return "eventpipe-" + part + "/" + Version() }

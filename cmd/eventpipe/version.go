package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and revision are stamped at link time by the image build
// (deploy/image: -X main.version=... -X main.revision=...). A plain `go
// build` leaves them empty and --version falls back to the module's build
// information.
var (
	version  string
	revision string
)

// versionString is what `eventpipe --version` prints:
// "eventpipe <version> (revision <commit>, <go version>)".
func versionString() string {
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
	return fmt.Sprintf("eventpipe %s (revision %s, %s)", v, r, runtime.Version())
}

package main

import (
	"fmt"
	"runtime"

	"github.com/eventpipe/eventpipe/internal/buildinfo"
)

// versionString is what `eventpipe --version` prints:
// "eventpipe <version> (revision <commit>, <go version>)". The version and
// revision are internal/buildinfo's, stamped at link time by the release
// build (deploy/image), the same ones the sinks report.
func versionString() string {
	return fmt.Sprintf("eventpipe %s (revision %s, %s)", buildinfo.Version(), buildinfo.Revision(), runtime.Version())
}

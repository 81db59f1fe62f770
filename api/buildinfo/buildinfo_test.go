package buildinfo

import "testing"

// An unstamped test binary falls back to "dev" (its module version is
// "(devel)", which is no version); user agents carry the version. The
// stamped case is cmd/eventpipe's TestReleaseBuildReportsItsVersion, which
// links with the release flags.
func TestUnstampedFallbacks(t *testing.T) {
	if got := Version(); got != "dev" {
		t.Errorf("Version() = %q, want dev", got)
	}
	if got := UserAgent("loki-sink"); got != "eventpipe-loki-sink/dev" {
		t.Errorf("UserAgent = %q", got)
	}
	if Revision() == "" {
		t.Error("Revision() is empty, want a commit or unknown")
	}
}

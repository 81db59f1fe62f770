package kafka

import (
	"os"
	"testing"

	"github.com/eventpipe/eventpipe/internal/buildinfo"
)

// TestBuildVersionInRecords: the OCSF metadata.product.version and the
// eventpipe-version header are the build's version (internal/buildinfo).
// cmd/eventpipe's TestReleaseBuildReportsItsVersion runs this test in a
// binary linked with the release flags and EVENTPIPE_WANT_VERSION set to the
// version it stamped; run alone it checks against the unstamped fallback.
func TestBuildVersionInRecords(t *testing.T) {
	want := os.Getenv("EVENTPIPE_WANT_VERSION")
	if want == "" {
		want = buildinfo.Version()
	}
	for _, format := range []string{FormatJSON, FormatProtobuf, FormatOCSF} {
		e := encoder{format: format, source: DefaultSource, maxBytes: DefaultMaxMessageBytes}
		msg, _, fits, err := e.encode(seedOccurrence())
		if err != nil || !fits {
			t.Fatalf("%s: encode: fits %v, %v", format, fits, err)
		}
		if got := header(msg, HeaderVersion); got != want {
			t.Errorf("%s: header %s %q, want %q", format, HeaderVersion, got, want)
		}
	}
	if got := OCSF(seedOccurrence()).Metadata.Product.Version; got != want {
		t.Errorf("OCSF metadata.product.version %q, want %q", got, want)
	}
}

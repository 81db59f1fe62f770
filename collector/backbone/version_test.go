package backbone

import (
	"os"
	"testing"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestBuildVersionInBackboneRecords: every backbone record names the build
// that wrote it in its eventpipe-version header. cmd/eventpipe's
// TestReleaseBuildReportsItsVersion runs it in a binary linked with the
// release flags and EVENTPIPE_WANT_VERSION set to the stamped version.
func TestBuildVersionInBackboneRecords(t *testing.T) {
	want := os.Getenv("EVENTPIPE_WANT_VERSION")
	if want == "" {
		want = buildinfo.Version()
	}
	r, err := Encode(&eventpipev1.Occurrence{EventId: "c1/u/1", Cluster: "c1"}, "events")
	if err != nil {
		t.Fatal(err)
	}
	if got := header(r, HeaderVersion); got != want {
		t.Errorf("header %s %q, want %q", HeaderVersion, got, want)
	}
}

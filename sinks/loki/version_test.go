package loki

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/api/buildinfo"
)

// TestUserAgentIsTheBuildVersion: the sink names itself with the build's
// version (api/buildinfo). cmd/eventpipe's
// TestReleaseBuildReportsItsVersion runs this test in a binary linked with
// the release flags and EVENTPIPE_WANT_VERSION set to the version it
// stamped; run alone it checks against the unstamped fallback.
func TestUserAgentIsTheBuildVersion(t *testing.T) {
	want := os.Getenv("EVENTPIPE_WANT_VERSION")
	if want == "" {
		want = buildinfo.Version()
	}
	var mu sync.Mutex
	var agents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents = append(agents, r.UserAgent())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	s := newTestSink(t, srv.URL+"/loki/api/v1/push", nil)
	if err := s.Push(context.Background(), records(scheduled(1, time.Now().Add(-time.Second)))); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(agents) != 1 || agents[0] != "eventpipe-loki-sink/"+want {
		t.Fatalf("User-Agent %q, want eventpipe-loki-sink/%s", agents, want)
	}
}

package collector

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
)

// fakeReadinessLog stands in for the store in a unit test of /readyz logic.
type fakeReadinessLog struct{ writable error }

func (f *fakeReadinessLog) Writable() error { return f.writable }

func TestReadinessNamesTheProblem(t *testing.T) {
	log := &fakeReadinessLog{}
	r := &readiness{log: log}
	t0 := time.Unix(1_800_000_000, 0)
	if p := r.check(t0); len(p) != 0 {
		t.Fatalf("ready store: %v", p)
	}
	log.writable = fmt.Errorf("fsync: input/output error")
	if p := r.check(t0.Add(time.Minute)); len(p) != 1 || !strings.Contains(p[0], "store not writable: fsync") {
		t.Fatalf("unwritable store: %v", p)
	}
}

// Defect 5 of issue 13: readiness failed for 15 minutes after a sink lost
// records to retention, removing the only collector endpoint. A sink's loss
// is counted (store and sink agree) and the collector stays ready.
func TestSinkLossToRetentionKeepsTheCollectorReady(t *testing.T) {
	cfg := store.NewDefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.SegmentBytes = 8 << 10
	cfg.Retention.MaxBytes = 16 << 10
	st, err := store.Open(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for b := range 20 {
		if _, err := st.Append(ctx, "c", "events", "", testOccurrences(b*10, 10)); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := st.Cursor("loki")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	// The sink reads from its cursor (0) and finds the gap.
	_, skipped, err := st.Read(ctx, 1, 10)
	if err != nil || skipped == 0 {
		t.Fatalf("read behind retention: skipped %d: %v", skipped, err)
	}
	cur.(sinks.LossCursor).Lost(1, skipped)
	if st.Lost()["loki"] != skipped {
		t.Fatalf("store lost = %v", st.Lost())
	}
	c := &Collector{ready: &readiness{log: st}}
	c.buildHTTP()
	srv := c.http
	ln := listenLoopback(t)
	go srv.Serve(ln)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz = %d %q after a sink lost %d records to retention; want ready", resp.StatusCode, body, skipped)
	}
}

func testOccurrences(from, n int) []*eventpipev1.Occurrence {
	out := make([]*eventpipev1.Occurrence, n)
	for i := range out {
		out[i] = occ(fmt.Sprintf("uid-%d/1", from+i), "sb-1", "ws", "sandbox", "gw")
	}
	return out
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

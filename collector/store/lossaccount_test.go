package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/sinks"
)

// downPusher refuses (retryably) while down is set and records what it got.
type downPusher struct {
	down  atomic.Bool
	mu    sync.Mutex
	got   map[uint64]bool
	tries atomic.Int64
}

func (p *downPusher) Push(_ context.Context, batch []sinks.Record) error {
	p.tries.Add(1)
	if p.down.Load() {
		return errors.New("destination down")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range batch {
		p.got[r.Offset] = true
	}
	return nil
}

// The store and the sink must count the same number of records lost to
// retention for the same event: a sink holding a batch it cannot push (its
// destination is down) has read those records; retention removing them from
// the log does not lose them for the sink.
func TestStoreAndSinkAgreeOnRetentionLoss(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.SegmentBytes = 8 << 10 // ~12 records per segment
	cfg.Retention.MaxBytes = 16 << 10
	s := mustOpen(t, cfg, options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for b := range 20 {
		if _, err := s.Append(ctx, "c", "events", "", occs(b*10, 10)); err != nil {
			t.Fatal(err)
		}
	}
	cur, err := s.Cursor("loki")
	if err != nil {
		t.Fatal(err)
	}
	p := &downPusher{got: map[uint64]bool{}}
	p.down.Store(true)
	rc := sinks.NewDefaultRunnerConfig("loki")
	rc.Batch.MaxRecords = 50
	rc.Batch.MaxWait = time.Millisecond
	rc.Retry.Initial, rc.Retry.Max, rc.Retry.Jitter = 5*time.Millisecond, 5*time.Millisecond, 0
	rc.CommitInterval = 0
	r, err := sinks.NewRunner(rc, p, s, cur, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for p.tries.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	// The runner holds offsets 1..50 and cannot push them.
	removed, err := s.ApplyRetention()
	if err != nil || removed < 100 {
		t.Fatalf("retention removed %d: %v", removed, err)
	}
	// Counted while the push is still being retried, not only when the
	// destination is back: an alert fires during the outage.
	deadline := time.Now().Add(10 * time.Second)
	for r.Status().Lost != removed-50 || s.Lost()["loki"] != removed-50 {
		if time.Now().After(deadline) {
			t.Fatalf("during the outage: sink lost %d, store says %d, want %d", r.Status().Lost, s.Lost()["loki"], removed-50)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.down.Store(false)
	for r.Status().Handled < 200 {
		if time.Now().After(deadline) {
			t.Fatalf("runner stuck: %+v", r.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	st := r.Status()
	p.mu.Lock()
	delivered := uint64(len(p.got))
	p.mu.Unlock()
	if delivered+st.Lost != 200 {
		t.Fatalf("sink delivered %d and lost %d of 200", delivered, st.Lost)
	}
	if got := s.Lost()["loki"]; got != st.Lost {
		t.Fatalf("store counts %d records lost by loki, the sink counts %d (removed %d, delivered %d)", got, st.Lost, removed, delivered)
	}
	if got := counter(t, s.m.consumerLost); got != float64(st.Lost) {
		t.Fatalf("eventpipe_collector_log_consumer_lost_records_total = %v, sink lost %d", got, st.Lost)
	}
}

package sinks_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

type recordingPusher struct {
	mu  sync.Mutex
	got []uint64
}

func (p *recordingPusher) Push(_ context.Context, batch []sinks.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range batch {
		p.got = append(p.got, r.Offset)
	}
	return nil
}

func (p *recordingPusher) offsets() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]uint64(nil), p.got...)
}

// A committed cursor beyond the end of the log (the log lost records, or
// was replaced) used to make the runner wait for an offset past its cursor
// and skip, silently, every new record below it. It is reported (log,
// metric, Status.LastError) and the runner resumes from the log's end.
func TestCursorBeyondTheLogIsReportedAndSkipsNothing(t *testing.T) {
	log := sinktest.NewMemLog()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occ := func(i int) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{EventId: "e-" + string(rune('a'+i)), Type: "Warning", Reason: "Failed"}
	}
	for i := range 5 {
		if err := log.Append(ctx, []*eventpipev1.Occurrence{occ(i)}); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := log.Cursor("file")
	if err := cur.Commit(50); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p := &recordingPusher{}
	rc := sinks.NewDefaultRunnerConfig("file")
	rc.Batch.MaxWait = time.Millisecond
	r, err := sinks.NewRunner(rc, p, log, cur, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(r.Status().LastError, "beyond the end of the log") {
		if time.Now().After(deadline) {
			t.Fatalf("a cursor beyond the log was not reported: %+v", r.Status())
		}
		time.Sleep(time.Millisecond)
	}
	if err := log.Append(ctx, []*eventpipev1.Occurrence{occ(6)}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(p.offsets()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the record appended after the restart (offset 6) was never delivered: cursor 50 skips it (status %+v)", r.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := p.offsets(); len(got) != 1 || got[0] != 6 {
		t.Fatalf("delivered %v, want [6]", got)
	}
	mfs, _ := reg.Gather()
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "eventpipe_sink_cursor_beyond_log_total" {
			found = mf.GetMetric()[0].GetCounter().GetValue() == 1
		}
	}
	if !found {
		t.Fatal("eventpipe_sink_cursor_beyond_log_total is not 1")
	}
}

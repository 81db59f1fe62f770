package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lastSegment returns the path of the newest log segment.
func lastSegment(t *testing.T, dir string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "log", "*.seg"))
	if len(m) == 0 {
		t.Fatal("no segment")
	}
	return m[len(m)-1]
}

// Defect (issue 13): ingest 100, SIGKILL, cut 5 bytes off the newest
// segment, restart: the repair dropped record 100, the next occurrence
// reused offset 100 and a sink (or Follow subscriber) whose cursor was 100
// never saw it. Now the loss of a record a consumer had committed refuses
// the start until accepted, offsets up to 100 are never handed out again,
// and the next occurrence reaches the consumer.
func TestTailRepairNeverReusesAnOffset(t *testing.T) {
	for _, committed := range []bool{true, false} {
		t.Run(map[bool]string{true: "consumer committed the torn record", false: "no consumer evidence"}[committed], func(t *testing.T) {
			testTailRepairNeverReusesAnOffset(t, committed)
		})
	}
}

func testTailRepairNeverReusesAnOffset(t *testing.T, committed bool) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	ctx := context.Background()
	s := mustOpen(t, cfg, options{})
	for b := range 10 {
		if _, err := s.Append(ctx, "c", "events", "", occs(b*10, 10)); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := s.Cursor("file")
	if committed {
		if err := cur.Commit(100); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	seg := lastSegment(t, dir)
	st, _ := os.Stat(seg)
	if err := os.Truncate(seg, st.Size()-5); err != nil {
		t.Fatal(err)
	}

	if committed {
		// Record 100 was acknowledged and delivered: its loss is loud.
		if _, err := openWith(cfg, nil, nil, options{}); !errors.Is(err, ErrDataLoss) {
			t.Fatalf("open after losing a committed record: %v, want ErrDataLoss", err)
		}
		cfg.AcceptDataLoss = true
	}
	reg := prometheus.NewRegistry()
	s2, err := openWith(cfg, nil, reg, options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, last := s2.Bounds(); last != 100 {
		t.Fatalf("log end after the repair = %d, want 100 (no offset handed out twice)", last)
	}
	wantLost := 0.0
	if committed {
		wantLost = 1
	}
	if got := gathered(t, reg, "eventpipe_collector_log_data_loss_records_total"); got != wantLost {
		t.Fatalf("data_loss_records_total = %v, want %v", got, wantLost)
	}
	// A Follow subscriber or sink resuming from 100 waits for the next
	// record instead of spinning or skipping it.
	waited := make(chan error, 1)
	go func() { waited <- s2.Wait(ctx, 100) }()
	select {
	case err := <-waited:
		t.Fatalf("Wait(100) returned before a new record: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	res, err := s2.Append(ctx, "c", "events", "", occs(5000, 1))
	if err != nil || res.Stored != 1 {
		t.Fatalf("append after repair: %+v %v", res, err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if res.LastOffset != 101 {
		t.Fatalf("new occurrence got offset %d, want 101", res.LastOffset)
	}
	from := uint64(100)
	recs, skipped, err := s2.Read(ctx, from+1, 10)
	if err != nil || len(recs) != 1 || recs[0].Occurrence.GetEventId() != occ(5000).GetEventId() {
		t.Fatalf("read after cursor %d: %d records, skipped %d, err %v: the new occurrence is invisible to the sink (offset %d reused?)",
			from, len(recs), skipped, err, res.LastOffset)
	}
}

// Defect: one flipped byte in the middle of the active segment truncated the
// log there, dropping 5,000 intact acknowledged records.
func TestFlippedByteLosesExactlyOneRecord(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	ctx := context.Background()
	s := mustOpen(t, cfg, options{})
	for b := range 100 {
		if _, err := s.Append(ctx, "c", "events", "", occs(1+b*100, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.wal().Segments()); n != 1 {
		t.Fatalf("want one segment, got %d", n)
	}
	s.Close()
	seg := lastSegment(t, dir)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte(occ(5000).GetEventId()))
	if at < 0 {
		t.Fatal("record 5000 not found in the segment")
	}
	b[at+3] ^= 0x40
	if err := os.WriteFile(seg, b, 0o640); err != nil {
		t.Fatal(err)
	}

	if _, err := openWith(cfg, nil, nil, options{}); !errors.Is(err, ErrDataLoss) {
		t.Fatalf("open with a damaged acknowledged record: %v, want ErrDataLoss", err)
	}
	cfg.AcceptDataLoss = true
	reg := prometheus.NewRegistry()
	s2, err := openWith(cfg, nil, reg, options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := gathered(t, reg, "eventpipe_collector_log_data_loss_records_total"); got != 1 {
		t.Fatalf("data_loss_records_total = %v, want 1", got)
	}
	if l := s2.DataLoss(); len(l) != 1 || l[0].From != 5000 || l[0].To != 5000 {
		t.Fatalf("DataLoss = %+v", l)
	}
	recs, _, err := s2.Read(ctx, 1, 20000)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if len(recs) != 9999 {
		t.Fatalf("read %d records after one flipped byte, want 9999", len(recs))
	}
	for _, r := range recs {
		if r.Offset == 5000 || r.Occurrence.GetEventId() != occ(int(r.Offset)).GetEventId() {
			t.Fatalf("record at offset %d is %s", r.Offset, r.Occurrence.GetEventId())
		}
	}
}

// gathered returns the value of a counter or gauge without labels.
func gathered(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

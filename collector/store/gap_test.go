package store

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks"
)

// cutAtFrame cuts n records off the end of a log segment, at a frame
// boundary (every frame left intact), and returns the offsets cut. It reads
// the frames as ../wal/FORMAT.md lays them out: a 16-byte header, then
// frames of a 16-byte header (length in bits 0..30 of the first word, the
// offset in bytes 8..15) and the payload.
func cutAtFrame(t *testing.T, path string, n int) (from, to uint64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var starts []int
	var offs []uint64
	for p := 16; p+16 <= len(b); {
		starts = append(starts, p)
		offs = append(offs, binary.LittleEndian.Uint64(b[p+8:]))
		p += 16 + int(binary.LittleEndian.Uint32(b[p:])&(1<<31-1))
	}
	if len(starts) < n {
		t.Fatalf("%s holds %d records, cannot cut %d", filepath.Base(path), len(starts), n)
	}
	if err := os.Truncate(path, int64(starts[len(starts)-n])); err != nil {
		t.Fatal(err)
	}
	return offs[len(offs)-n], offs[len(offs)-1]
}

// offsetPusher records the offsets a sink was given.
type offsetPusher struct {
	mu  sync.Mutex
	got map[uint64]bool
}

func (p *offsetPusher) Push(_ context.Context, batch []sinks.Record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range batch {
		p.got[r.Offset] = true
	}
	return nil
}

// Session 7's open defect, end to end: a sealed segment of the log cut
// short at a frame boundary lost its last records without a word (readers
// stepped over the offsets as if a repair had skipped them). Now:
//   - inside the dedupe window (read while the store opens) the start is
//     refused with ErrDataLoss naming the segment;
//   - outside it, the store opens and a sink added later, reading the log
//     from the start, gets every other record while the loss is counted
//     (data_loss_records_total = the records cut, DataLoss names them);
//   - accepted, the next start without accepting is clean.
func TestSealedSegmentCutShortIsCountedForALaterSink(t *testing.T) {
	cfg := testConfig(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	segs := sealedLog(t, &cfg)
	from, to := cutAtFrame(t, segs[1], 3)
	lost := to - from + 1

	_, err := openWith(cfg, nil, nil, options{})
	if !errors.Is(err, ErrDataLoss) || !strings.Contains(err.Error(), filepath.Base(segs[1])) {
		t.Fatalf("open with a sealed segment cut short (inside the dedupe window): %v, want ErrDataLoss naming %s", err, filepath.Base(segs[1]))
	}

	// Outside the dedupe window: not read while the store opens.
	old := time.Now().Add(-2 * cfg.DedupeWindow)
	for _, p := range segs {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	s2, err := openWith(cfg, nil, reg, options{})
	if err != nil {
		t.Fatalf("open with the cut segment outside the dedupe window: %v", err)
	}
	cur, err := s2.Cursor("late")
	if err != nil {
		t.Fatal(err)
	}
	p := &offsetPusher{got: map[uint64]bool{}}
	rc := sinks.NewDefaultRunnerConfig("late")
	rc.Batch.MaxRecords = 50
	rc.Batch.MaxWait = time.Millisecond
	rc.CommitInterval = 0
	r, err := sinks.NewRunner(rc, p, s2, cur, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	for r.Status().Handled < 200 {
		if ctx.Err() != nil {
			t.Fatalf("late sink stuck: %+v", r.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	for o := uint64(1); o <= 200; o++ {
		if p.got[o] == (o >= from && o <= to) {
			t.Errorf("offset %d: delivered %v", o, p.got[o])
		}
	}
	p.mu.Unlock()
	if got := gathered(t, reg, "eventpipe_collector_log_data_loss_records_total"); got != float64(lost) {
		t.Fatalf("data_loss_records_total = %v, want %d", got, lost)
	}
	if l := s2.DataLoss(); len(l) != 1 || l[0].From != from || l[0].To != to {
		t.Fatalf("DataLoss = %+v, want offsets %d..%d", l, from, to)
	}
	s2.Close()

	accept := cfg
	accept.AcceptDataLoss = true
	for _, p := range segs {
		os.Chtimes(p, time.Now(), time.Now()) // inside the window again: read at open
	}
	s3, err := openWith(accept, nil, nil, options{})
	if err != nil {
		t.Fatal(err)
	}
	if l := s3.DataLoss(); len(l) != 1 || l[0].From != from || l[0].To != to {
		t.Fatalf("accepted: DataLoss = %+v", l)
	}
	s3.Close()
	s4, err := openWith(cfg, nil, nil, options{})
	if err != nil {
		t.Fatalf("open after the accepted loss: %v", err)
	}
	defer s4.Close()
	recs, _, err := s4.Read(ctx, 1, 1000)
	if err != nil || uint64(len(recs)) != 200-lost || len(s4.DataLoss()) != 0 {
		t.Fatalf("after the accepted loss: %d records, loss %v, %v", len(recs), s4.DataLoss(), err)
	}
}

// Retention counts the records it removes (retention_removed_records_total),
// not the offsets: the gap segment an accepted loss leaves holds none, and
// its offsets were counted as data loss already.
func TestRetentionCountsRecordsNotGapOffsets(t *testing.T) {
	cfg := testConfig(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	segs := sealedLog(t, &cfg)
	from, to := cutAtFrame(t, segs[1], 3)
	accept := cfg
	accept.AcceptDataLoss = true
	s, err := openWith(accept, nil, nil, options{}) // the cut offsets become a gap segment
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	files, _ := filepath.Glob(filepath.Join(cfg.Dir, "log", "*.seg"))
	old := time.Now().Add(-time.Hour)
	for _, p := range files {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Retention.MaxAge = 10 * time.Minute // every sealed segment is older
	cfg.DedupeWindow = time.Minute
	reg := prometheus.NewRegistry()
	s2, err := openWith(cfg, nil, reg, options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	before, _, err := s2.Read(ctx, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s2.ApplyRetention()
	if err != nil {
		t.Fatal(err)
	}
	after, skipped, err := s2.Read(ctx, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(len(before) - len(after))
	if n != want || skipped != want {
		t.Fatalf("retention removed %d records (%d before, %d after) but reported %d, a reader from 1 skipped %d; the gap %d..%d holds none", want, len(before), len(after), n, skipped, from, to)
	}
	if got := gathered(t, reg, "eventpipe_collector_log_retention_removed_records_total"); got != float64(want) {
		t.Fatalf("retention_removed_records_total = %v, want %d", got, want)
	}
}

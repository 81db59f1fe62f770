package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
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

// The checkpoint (cluster cursor) is fsynced in parallel with the log. After
// a power cut during the last round, the checkpoint of that round may be on
// disk while the round's records are torn. With the resynchronising repair
// the intact records after the torn one survive, so "the checkpoint is not
// beyond the last record" is no longer enough: it must also not cover the
// torn record, or the agent would never re-send it.
func TestCheckpointDoesNotCoverATornRecord(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	ctx := context.Background()
	s := mustOpen(t, cfg, options{})
	for b := range 10 {
		if _, err := s.Append(ctx, "c", "events", strconv.Itoa(b+1), occs(b*10, 10)); err != nil {
			t.Fatal(err)
		}
	}
	// Round 11: records written, checkpoint written and fsynced, the log's
	// fsync never happened (the power went out).
	var recs [][]byte
	for _, o := range occs(100, 10) {
		rec := appendEnvelope(nil, time.Now(), kindOccurrence)
		rec, err := proto.MarshalOptions{}.MarshalAppend(rec, o)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	if _, err := s.wal().Write([][][]byte{recs}); err != nil {
		t.Fatal(err)
	}
	if err := s.ckpt.write(checkpoint{lastOffset: 110, cursors: map[streamKey]string{{"c", "events"}: "11"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The page holding record 105 did not make it to the disk.
	seg := lastSegment(t, dir)
	b, _ := os.ReadFile(seg)
	at := bytes.Index(b, []byte(occ(104).GetEventId()))
	b[at] ^= 0xff
	os.WriteFile(seg, b, 0o640)

	s2 := mustOpen(t, cfg, options{})
	if r := s2.Repaired(); r.TornFrom != 105 || len(r.Lost) != 0 {
		t.Fatalf("repair = %+v, want a torn write from 105 and no acknowledged loss", r)
	}
	if rv, _ := s2.ClusterCursor("c", "events"); rv != "10" {
		t.Fatalf("cluster cursor = %q after a torn round 11, want 10 (the agent must re-send batch 11)", rv)
	}
	// The agent re-sends batch 11: 105 is stored again, the rest are
	// duplicates.
	res, err := s2.Append(ctx, "c", "events", "11", occs(100, 10))
	if err != nil || res.Stored != 1 || res.Duplicates != 9 {
		t.Fatalf("re-send of batch 11: %+v %v", res, err)
	}
}

// sealedLog writes 200 occurrences (offsets 1..200, in batches of 10) into
// 8 KiB segments of a store configured by cfg (whose SegmentBytes it sets),
// closes it and returns the segment files, oldest first: several of them,
// so that all but the last are sealed.
func sealedLog(t *testing.T, cfg *Config) []string {
	t.Helper()
	cfg.SegmentBytes = 8 << 10
	s := mustOpen(t, *cfg, options{})
	for b := range 20 {
		if _, err := s.Append(context.Background(), "c", "events", "", occs(b*10, 10)); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	segs, _ := filepath.Glob(filepath.Join(cfg.Dir, "log", "*.seg"))
	if len(segs) < 4 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	return segs
}

// A damaged record in an older (sealed) segment, read while the store
// opens (the dedupe index is rebuilt from the segments inside the window):
// the start is refused; accepted, that record only is lost, and the segment
// is rewritten so the next start (without accepting) is clean.
func TestSealedSegmentDamageRefusedThenRepairedOnce(t *testing.T) {
	cfg := testConfig(t.TempDir())
	ctx := context.Background()
	segs := sealedLog(t, &cfg)
	b, _ := os.ReadFile(segs[0])
	at := bytes.Index(b, []byte(occ(3).GetEventId()))
	b[at+2] ^= 0x20
	os.WriteFile(segs[0], b, 0o640)

	if _, err := openWith(cfg, nil, nil, options{}); !errors.Is(err, ErrDataLoss) {
		t.Fatalf("open with a damaged sealed record: %v, want ErrDataLoss", err)
	}
	accept := cfg
	accept.AcceptDataLoss = true
	s2, err := openWith(accept, nil, nil, options{})
	if err != nil {
		t.Fatal(err)
	}
	if l := s2.DataLoss(); len(l) != 1 || l[0].From != 4 || l[0].To != 4 {
		t.Fatalf("DataLoss = %+v, want offset 4", l)
	}
	recs, _, err := s2.Read(ctx, 1, 1000)
	if err != nil || len(recs) != 199 {
		t.Fatalf("read %d records: %v", len(recs), err)
	}
	s2.Close()
	s3, err := openWith(cfg, nil, nil, options{})
	if err != nil {
		t.Fatalf("open after the accepted repair: %v", err)
	}
	defer s3.Close()
	if recs, _, err := s3.Read(ctx, 1, 1000); err != nil || len(recs) != 199 || len(s3.DataLoss()) != 0 {
		t.Fatalf("after the accepted repair: %d records, loss %v, %v", len(recs), s3.DataLoss(), err)
	}
}

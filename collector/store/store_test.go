package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashWriterEnv); dir != "" {
		os.Exit(crashWriter(dir))
	}
	goleak.VerifyTestMain(m)
}

func TestConfigValidate(t *testing.T) {
	if err := NewDefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bad := Config{SegmentBytes: 100, Retention: RetentionConfig{MaxBytes: -1, MaxAge: -time.Hour},
		DedupeWindow: 0, MaxInflightBytes: 0}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"dir: must be set", "segment_bytes: 100 is below", "retention.max_bytes: -1",
		"retention.max_age: -1h0m0s", "dedupe_window: 0s must be positive", "max_inflight_bytes: 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("validation error lacks %q:\n%v", want, err)
		}
	}
	c := testConfig("/x")
	c.Retention = RetentionConfig{MaxBytes: c.SegmentBytes, MaxAge: 30 * time.Minute}
	err = c.Validate()
	for _, want := range []string{"retention.max_bytes: 67108864 must be at least twice segment_bytes", "dedupe_window: 1h0m0s must not exceed retention.max_age"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validation error lacks %q: %v", want, err)
		}
	}
	if _, err := Open(Config{}, nil, nil); err == nil || !strings.Contains(err.Error(), "dir: must be set") {
		t.Fatalf("Open with an empty config: %v", err)
	}
}

func TestAppendReadRoundTrip(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()), options{})
	ctx := context.Background()
	var want []*eventpipev1.Occurrence
	for b := range 5 {
		batch := occs(b*20, 20)
		res, err := s.Append(ctx, "prod-eu-1", "events", "1000", batch)
		if err != nil {
			t.Fatal(err)
		}
		if res.Stored != 20 || res.Duplicates != 0 || res.LastOffset != uint64((b+1)*20) {
			t.Fatalf("batch %d: %+v", b, res)
		}
		want = append(want, batch...)
	}
	if f, l := s.Bounds(); f != 1 || l != 100 {
		t.Fatalf("bounds %d,%d", f, l)
	}
	recs, skipped, err := s.Read(ctx, 0, 1000)
	if err != nil || skipped != 0 || len(recs) != 100 {
		t.Fatalf("read: %d records, skipped %d, %v", len(recs), skipped, err)
	}
	for i, r := range recs {
		if r.Offset != uint64(i+1) || !proto.Equal(r.Occurrence, want[i]) {
			t.Fatalf("record %d: offset %d, %v", i, r.Offset, r.Occurrence.GetEventId())
		}
	}
	recs, _, _ = s.Read(ctx, 42, 3)
	if len(recs) != 3 || recs[0].Offset != 42 || recs[0].Occurrence.GetEventId() != want[41].GetEventId() {
		t.Fatalf("read from 42: %v", recs)
	}
	if size := len(mustMarshal(t, want[0])); size < 500 || size > 800 {
		t.Fatalf("fixture is %d bytes, want a realistic ~600", size)
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAppendRejectsBadInput(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()), options{})
	ctx := context.Background()
	cases := []struct {
		name                string
		cluster, stream, rv string
		occs                []*eventpipev1.Occurrence
	}{
		{"nil occurrence", "c", "events", "1", []*eventpipev1.Occurrence{occ(1), nil}},
		{"resourceVersion without cluster", "", "events", "1", nil},
		{"resourceVersion without stream", "c", "", "1", nil},
		{"oversized occurrence", "c", "events", "1", []*eventpipev1.Occurrence{{EventId: "x", Message: strings.Repeat("m", maxOccurrenceLen)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Append(ctx, tc.cluster, tc.stream, tc.rv, tc.occs); !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
	if _, l := s.Bounds(); l != 0 {
		t.Fatalf("invalid batches stored %d records", l)
	}
	if err := s.Writable(); err != nil {
		t.Fatalf("bad input made the store unwritable: %v", err)
	}
}

func TestDedupe(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	cfg := testConfig(dir)
	s := mustOpen(t, cfg, options{now: clock.Now})
	ctx := context.Background()
	check := func(s *Store, batch []*eventpipev1.Occurrence, stored, dups int) {
		t.Helper()
		res, err := s.Append(ctx, "c", "events", "", batch)
		if err != nil || res.Stored != stored || res.Duplicates != dups {
			t.Fatalf("append: %+v %v, want stored %d dups %d", res, err, stored, dups)
		}
	}
	check(s, occs(0, 10), 10, 0)
	check(s, occs(5, 10), 5, 5)                                                       // relist overlap
	check(s, []*eventpipev1.Occurrence{occ(20), occ(20), occ(21)}, 2, 1)              // repeated inside a batch
	check(s, []*eventpipev1.Occurrence{{Message: "no id"}, {Message: "no id"}}, 2, 0) // no event_id: stored
	if got := counter(t, s.m.deduplicated); got != 6 {
		t.Fatalf("deduplicated_total = %v", got)
	}

	// Across a restart: the index is rebuilt from the log.
	clock.Add(30 * time.Minute)
	s.Close()
	s2 := mustOpen(t, cfg, options{now: clock.Now})
	check(s2, occs(0, 15), 0, 15)
	check(s2, occs(20, 2), 0, 2)
	check(s2, occs(22, 2), 2, 0)

	// Beyond the window the id may be stored again.
	clock.Add(31 * time.Minute) // occs 0..21 are 61 min old, 22..23 are 31 min old
	check(s2, occs(20, 4), 2, 2)
	s2.Close()
	clock.Add(10 * time.Minute)
	s3 := mustOpen(t, cfg, options{now: clock.Now})
	check(s3, occs(0, 1), 1, 0)  // 71 min old: expired
	check(s3, occs(22, 2), 0, 2) // 41 min old: still known after reopen
	check(s3, occs(20, 2), 0, 2) // re-stored 10 min ago
}

func TestConcurrentAppendsStoreEachIDOnce(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()), options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	stored, dups := 0, 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range 20 {
				// Overlapping ranges: every id is offered by several writers.
				res, err := s.Append(ctx, "c", "events", "", occs((g*7+b*13)%200, 25))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				stored += res.Stored
				dups += res.Duplicates
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	recs, _, err := s.Read(ctx, 1, 10000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[r.Occurrence.GetEventId()] {
			t.Fatalf("%s stored twice", r.Occurrence.GetEventId())
		}
		seen[r.Occurrence.GetEventId()] = true
	}
	if len(recs) != stored || stored+dups != 8*20*25 {
		t.Fatalf("log has %d, stored %d, dups %d", len(recs), stored, dups)
	}
}

func TestClusterCursor(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := mustOpen(t, cfg, options{})
	ctx := context.Background()
	if _, ok := s.ClusterCursor("a", "events"); ok {
		t.Fatal("cursor before any append")
	}
	mustAppend := func(cluster, rv string, batch []*eventpipev1.Occurrence) {
		t.Helper()
		if _, err := s.Append(ctx, cluster, "events", rv, batch); err != nil {
			t.Fatal(err)
		}
	}
	mustAppend("a", "100", occs(0, 3))
	mustAppend("b", "7", occs(3, 1))
	mustAppend("a", "150", nil)        // bookmark
	mustAppend("a", "", occs(10, 1))   // no resourceVersion: unchanged
	mustAppend("a", "160", occs(0, 3)) // all duplicates still advance the cursor
	if rv, ok := s.ClusterCursor("a", "events"); !ok || rv != "160" {
		t.Fatalf("cursor a = %q %v", rv, ok)
	}
	if _, l := s.Bounds(); l != 5 {
		t.Fatalf("bookmark or duplicates stored records: last = %d", l)
	}
	s.Close()
	s = mustOpen(t, cfg, options{})
	for cl, want := range map[string]string{"a": "160", "b": "7"} {
		if rv, ok := s.ClusterCursor(cl, "events"); !ok || rv != want {
			t.Fatalf("after reopen cursor %s = %q, want %q", cl, rv, want)
		}
	}
	mustAppend("a", "170", nil)
	s.Close()
	// A torn write of the newest slot: the previous commit's value is used.
	slot := slotPath(dir, int(s.ckpt.seq%2))
	b, _ := os.ReadFile(slot)
	os.WriteFile(slot, b[:len(b)-4], 0o640)
	s = mustOpen(t, cfg, options{})
	if rv, _ := s.ClusterCursor("a", "events"); rv != "160" {
		t.Fatalf("after a torn checkpoint slot cursor = %q, want the previous 160", rv)
	}
	mustAppend("a", "180", nil)
	s.Close()
	s = mustOpen(t, cfg, options{})
	if rv, _ := s.ClusterCursor("a", "events"); rv != "180" {
		t.Fatalf("cursor = %q after writing past a torn slot", rv)
	}
}

func TestConsumerCursor(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := mustOpen(t, cfg, options{})
	for _, bad := range []string{"", "../x", "a/b", ".hidden", "x.tmp", strings.Repeat("a", 200)} {
		if _, err := s.Cursor(bad); err == nil {
			t.Fatalf("consumer name %q accepted", bad)
		}
	}
	c, err := s.Cursor("loki")
	if err != nil {
		t.Fatal(err)
	}
	if off, err := c.Load(); err != nil || off != 0 {
		t.Fatalf("fresh cursor = %d %v", off, err)
	}
	for _, off := range []uint64{10, 20, 1 << 40} {
		if err := c.Commit(off); err != nil {
			t.Fatal(err)
		}
		if got, _ := c.Load(); got != off {
			t.Fatalf("load = %d after commit %d", got, off)
		}
	}
	s.Close()
	// A cursor beyond the end of the log means acknowledged records are
	// missing (or the log is another one): refused unless accepted.
	if _, err := openWith(cfg, nil, nil, options{}); !errors.Is(err, ErrDataLoss) {
		t.Fatalf("open with a cursor beyond the log: %v, want ErrDataLoss", err)
	}
	cfg.AcceptDataLoss = true
	s = mustOpen(t, cfg, options{})
	c, _ = s.Cursor("loki")
	if got, _ := c.Load(); got != 1<<40 {
		t.Fatalf("after reopen = %d", got)
	}
	if _, last := s.Bounds(); last != 1<<40 {
		t.Fatalf("log end after accepting = %d, want the cursor %d (offsets never reused)", last, uint64(1<<40))
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "cursors"))
	if len(entries) != 1 || entries[0].Name() != "loki" {
		t.Fatalf("cursor dir holds %v (temp files left?)", entries)
	}
	// A failed commit leaves the previous value in place.
	fs := &faultFS{match: "cursors", failSync: true}
	s.Close()
	s = mustOpen(t, cfg, options{fs: fs})
	c, _ = s.Cursor("loki")
	if err := c.Commit(5); err == nil {
		t.Fatal("commit with a failing fsync succeeded")
	}
	if got, _ := c.Load(); got != 1<<40 {
		t.Fatalf("failed commit changed the cursor to %d", got)
	}
}

func TestRetentionCountsLostPerConsumer(t *testing.T) {
	clock := newClock()
	cfg := testConfig(t.TempDir())
	cfg.SegmentBytes = 8 << 10 // ~12 records of ~650 bytes per segment
	cfg.Retention.MaxBytes = 24 << 10
	s := mustOpen(t, cfg, options{now: clock.Now})
	ctx := context.Background()
	behind, _ := s.Cursor("kafka")
	ahead, _ := s.Cursor("loki")
	for b := range 20 {
		if _, err := s.Append(ctx, "c", "events", "", occs(b*10, 10)); err != nil {
			t.Fatal(err)
		}
	}
	_, last := s.Bounds()
	ahead.Commit(last)
	behind.Commit(5)
	removed, err := s.ApplyRetention()
	if err != nil || removed == 0 {
		t.Fatalf("retention removed %d: %v", removed, err)
	}
	first, _ := s.Bounds()
	if first != removed+1 {
		t.Fatalf("first = %d after removing %d", first, removed)
	}
	// Only the consumer knows what it read before the removal: nothing is
	// counted until its runner reports it.
	if lost := s.Lost(); lost["kafka"] != 0 || lost["loki"] != 0 {
		t.Fatalf("lost = %v before any consumer reported", lost)
	}
	// The runner of "kafka" reads from 6, finds the gap and reports it.
	_, gap, err := s.Read(ctx, 6, 5)
	if err != nil || gap != removed-5 {
		t.Fatalf("read behind retention: skipped %d: %v", gap, err)
	}
	behind.(sinks.LossCursor).Lost(6, gap)
	lost := s.Lost()
	if lost["loki"] != 0 || lost["kafka"] != removed-5 {
		t.Fatalf("lost = %v, want kafka %d, loki 0", lost, removed-5)
	}
	if got := counter(t, s.m.consumerLost); got != float64(removed-5) {
		t.Fatalf("consumer_lost_records_total = %v", got)
	}
	if got := counter(t, s.m.retention); got != float64(removed) {
		t.Fatalf("retention_removed_records_total = %v", got)
	}
	recs, skipped, err := s.Read(ctx, 6, 5)
	if err != nil || skipped != removed-5 || recs[0].Offset != first {
		t.Fatalf("read behind retention: skipped %d first %d %v", skipped, recs[0].Offset, err)
	}
	// Age: everything but the active segment.
	clock.Add(cfg.Retention.MaxAge + time.Hour)
	s.Append(ctx, "c", "events", "", occs(1000, 1))
	if _, err := s.ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	if n := len(s.wal().Segments()); n != 1 {
		t.Fatalf("age retention left %d segments", n)
	}
}

func TestFlowControlBlocksAndUnblocks(t *testing.T) {
	fs := &faultFS{match: ".seg"}
	cfg := testConfig(t.TempDir())
	cfg.MaxInflightBytes = 20 << 10 // ~30 occurrences
	s := mustOpen(t, cfg, options{fs: fs})
	ctx := context.Background()
	gate := make(chan struct{})
	fs.set(func(f *faultFS) { f.syncGate = gate })

	first := make(chan error, 1)
	go func() { _, err := s.Append(ctx, "c", "events", "1", occs(0, 25)); first <- err }()
	// Wait until the first batch holds its capacity (it is stuck in fsync).
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, s.m.inflight) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Append(short, "c", "events", "2", occs(100, 25)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("append over the in-flight bound did not block: %v", err)
	}
	second := make(chan error, 1)
	go func() { _, err := s.Append(ctx, "c", "events", "3", occs(200, 25)); second <- err }()
	select {
	case err := <-second:
		t.Fatalf("second append returned while the log was stuck: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	for _, ch := range []chan error{first, second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("append still blocked after the log caught up")
		}
	}
	if _, l := s.Bounds(); l != 50 {
		t.Fatalf("last = %d, want 50 (the timed-out batch stores nothing)", l)
	}
	if rv, _ := s.ClusterCursor("c", "events"); rv != "3" {
		t.Fatalf("cursor %q", rv)
	}
}

func TestInjectedFailuresNeverAcknowledge(t *testing.T) {
	cases := []struct {
		name  string
		fault func(*faultFS)
	}{
		{"log write fails", func(f *faultFS) { f.match, f.failWrite = ".seg", true }},
		{"log fsync fails", func(f *faultFS) { f.match, f.failSync = ".seg", true }},
		{"checkpoint fsync fails", func(f *faultFS) { f.match, f.failSync = "checkpoint.", true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := &faultFS{}
			cfg := testConfig(t.TempDir())
			s := mustOpen(t, cfg, options{fs: fs})
			ctx := context.Background()
			if _, err := s.Append(ctx, "c", "events", "10", occs(0, 10)); err != nil {
				t.Fatal(err)
			}
			fs.set(tc.fault)
			_, err := s.Append(ctx, "c", "events", "20", occs(10, 10))
			if !errors.Is(err, ErrNotWritable) {
				t.Fatalf("append under fault = %v, want ErrNotWritable", err)
			}
			if rv, _ := s.ClusterCursor("c", "events"); rv != "10" {
				t.Fatalf("cursor moved to %q on a failed append", rv)
			}
			if err := s.Writable(); !errors.Is(err, ErrNotWritable) {
				t.Fatalf("Writable() = %v", err)
			}
			// Still failing: refused again, nothing acknowledged.
			if _, err := s.Append(ctx, "c", "events", "20", occs(10, 10)); err == nil {
				t.Fatal("append succeeded while the disk still fails")
			}
			fs.set(func(f *faultFS) { f.failWrite, f.failSync = false, false })
			// The retry repairs the log and stores every occurrence exactly once.
			res, err := s.Append(ctx, "c", "events", "20", occs(10, 10))
			if err != nil {
				t.Fatalf("retry after the fault cleared: %v", err)
			}
			if res.Stored+res.Duplicates != 10 {
				t.Fatalf("retry result %+v", res)
			}
			if err := s.Writable(); err != nil {
				t.Fatalf("Writable() after repair = %v", err)
			}
			if rv, _ := s.ClusterCursor("c", "events"); rv != "20" {
				t.Fatalf("cursor after retry = %q", rv)
			}
			recs, _, _ := s.Read(ctx, 1, 100)
			seen := map[string]int{}
			for _, r := range recs {
				seen[r.Occurrence.GetEventId()]++
			}
			for i := range 20 {
				if n := seen[occ(i).GetEventId()]; n != 1 {
					t.Fatalf("occurrence %d stored %d times", i, n)
				}
			}
		})
	}
}

func TestWait(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()), options{})
	ctx := context.Background()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.Wait(short, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on an empty log = %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx, 0) }()
	time.Sleep(20 * time.Millisecond)
	s.Append(ctx, "c", "events", "", occs(0, 1))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, 0); err != nil {
		t.Fatal("wait for an existing record blocked or failed")
	}
	go func() { done <- s.Wait(ctx, 1) }()
	time.Sleep(20 * time.Millisecond)
	s.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close = %v", err)
	}
	if _, err := s.Append(ctx, "c", "events", "", occs(1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close = %v", err)
	}
}

func TestRunAppliesRetentionAndStops(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.SegmentBytes = 8 << 10
	cfg.Retention.MaxBytes = 16 << 10
	s := mustOpen(t, cfg, options{tick: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	for b := range 10 {
		s.Append(ctx, "c", "events", "", occs(b*10, 10))
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.wal().Size() > cfg.Retention.MaxBytes && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if size := s.wal().Size(); size > cfg.Retention.MaxBytes {
		t.Fatalf("Run did not apply retention: %d bytes", size)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
}

func TestCheckpointAheadOfLogIsIgnoredAndCleared(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	ctx := context.Background()
	s := mustOpen(t, cfg, options{})
	if _, err := s.Append(ctx, "a", "events", "10", occs(0, 5)); err != nil {
		t.Fatal(err)
	}
	s.Close() // checkpoint seq 1 is in slot 1
	// A crash after the checkpoint's fsync but before the log's: a newer
	// checkpoint describes offset 6, which the log does not hold.
	ahead := checkpoint{seq: 99, lastOffset: 6, cursors: map[streamKey]string{{"a", "events"}: "20"}}
	if err := os.WriteFile(slotPath(dir, 0), encodeCheckpoint(ahead, time.Now()), 0o640); err != nil {
		t.Fatal(err)
	}
	fs := &faultFS{}
	s = mustOpen(t, cfg, options{fs: fs})
	if rv, _ := s.ClusterCursor("a", "events"); rv != "10" {
		t.Fatalf("cursor = %q, want 10: a checkpoint ahead of the log was trusted", rv)
	}
	if st, err := os.Stat(slotPath(dir, 0)); err != nil || st.Size() != 0 {
		t.Fatalf("the checkpoint ahead of the log was not cleared: %v", err)
	}
	// The log now reaches offset 6 with other data while no checkpoint
	// gets written: the stale one must not come back.
	fs.set(func(f *faultFS) { f.match, f.failWrite = "checkpoint.", true })
	if _, err := s.Append(ctx, "b", "events", "1", occs(5, 1)); !errors.Is(err, ErrNotWritable) {
		t.Fatalf("append with a failing checkpoint = %v", err)
	}
	s.Close()
	s = mustOpen(t, cfg, options{})
	if _, last := s.Bounds(); last != 6 {
		t.Fatalf("last = %d", last)
	}
	if rv, _ := s.ClusterCursor("a", "events"); rv != "10" {
		t.Fatalf("cursor a = %q after reopen, want 10: a cleared checkpoint came back", rv)
	}
}

func TestDedupeIndexIsBounded(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.DedupeMaxEntries = 100
	s := mustOpen(t, cfg, options{})
	ctx := context.Background()
	for b := range 5 {
		if _, err := s.Append(ctx, "c", "events", "", occs(b*50, 50)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.index); n > 100 {
		t.Fatalf("index holds %d entries, bound 100", n)
	}
	if got := counter(t, s.m.dedupeEvicted); got != 150 {
		t.Fatalf("dedupe_evicted_total = %v, want 150", got)
	}
	// The newest ids are still recognised; the evicted oldest are not.
	res, _ := s.Append(ctx, "c", "events", "", occs(200, 50))
	if res.Duplicates != 50 {
		t.Fatalf("newest ids: %+v", res)
	}
	s.Close()
	s = mustOpen(t, cfg, options{})
	if n := len(s.index); n > 100 {
		t.Fatalf("rebuilt index holds %d entries, bound 100", n)
	}
	res, _ = s.Append(ctx, "c", "events", "", occs(200, 50))
	if res.Duplicates != 50 {
		t.Fatalf("newest ids after reopen: %+v", res)
	}
}

// A batch admitted before a repair that Run performed (not its own round)
// must not store again what the repaired log already holds.
func TestRepairByRunDoesNotDuplicateQueuedBatch(t *testing.T) {
	fs := &faultFS{}
	s := mustOpen(t, testConfig(t.TempDir()), options{fs: fs})
	ctx := context.Background()
	fs.set(func(f *faultFS) { f.match, f.failSync = ".seg", true })
	if _, err := s.Append(ctx, "c", "events", "1", occs(0, 10)); !errors.Is(err, ErrNotWritable) {
		t.Fatalf("append under a failing fsync = %v", err)
	}
	fs.set(func(f *faultFS) { f.failSync = false })

	s.commitMu.Lock() // hold rounds back while the retry is admitted
	done := make(chan error, 1)
	go func() { _, err := s.Append(ctx, "c", "events", "1", occs(0, 10)); done <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := len(s.pending)
		s.mu.Unlock()
		if n == 10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.repairLocked(); err != nil { // what Run's maintain does
		t.Fatal(err)
	}
	s.commitMu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recs, _, _ := s.Read(ctx, 1, 100)
	if len(recs) != 10 {
		t.Fatalf("log holds %d records, want the 10 occurrences once", len(recs))
	}
}

// A sink-like reader following the log while appends and retention run:
// it sees offsets in order without gaps, except gaps reported as skipped.
func TestFollowWhileAppendingAndRetaining(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.SegmentBytes = 16 << 10
	cfg.Retention.MaxBytes = 64 << 10
	s := mustOpen(t, cfg, options{tick: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()

	const batches, per = 60, 20
	readerDone := make(chan error, 1)
	var seen, skipped uint64
	go func() {
		next := uint64(1)
		for next <= batches*per {
			recs, sk, err := s.Read(ctx, next, 37)
			if err != nil {
				readerDone <- err
				return
			}
			skipped += sk
			next += sk
			for _, r := range recs {
				if r.Offset != next {
					readerDone <- fmt.Errorf("got offset %d, want %d", r.Offset, next)
					return
				}
				next++
				seen++
			}
			if len(recs) == 0 && sk == 0 {
				if err := s.Wait(ctx, next-1); err != nil {
					readerDone <- err
					return
				}
			}
		}
		readerDone <- nil
	}()
	for b := range batches {
		if _, err := s.Append(ctx, "c", "events", "", occs(b*per, per)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-readerDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("reader did not reach the end")
	}
	if seen+skipped != batches*per {
		t.Fatalf("seen %d + skipped %d != %d", seen, skipped, batches*per)
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	t.Logf("follower read %d, skipped %d (retention)", seen, skipped)

	// A late reader from offset 1 is told exactly what retention removed.
	if _, err := s.ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	first, last := s.Bounds()
	if first == 1 {
		t.Fatal("retention removed nothing; the test needs it to")
	}
	recs, sk, err := s.Read(context.Background(), 1, batches*per)
	if err != nil || sk != first-1 || uint64(len(recs)) != last-first+1 || recs[0].Offset != first {
		t.Fatalf("late read: %d records, skipped %d, first %d: %v", len(recs), sk, first, err)
	}
}

func TestCursorIgnoresTempLeftByACrash(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, testConfig(dir), options{})
	if _, err := s.Append(context.Background(), "c", "events", "", occs(0, 50)); err != nil {
		t.Fatal(err)
	}
	c, _ := s.Cursor("file")
	if err := c.Commit(42); err != nil {
		t.Fatal(err)
	}
	// A crash between writing the temp file and the rename.
	if err := os.WriteFile(filepath.Join(dir, "cursors", "file.tmp"), []byte("9"), 0o640); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, testConfig(dir), options{})
	c, _ = s.Cursor("file")
	if got, err := c.Load(); err != nil || got != 42 {
		t.Fatalf("load = %d %v, want the committed 42", got, err)
	}
	if err := c.Commit(43); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Load(); got != 43 {
		t.Fatalf("load = %d", got)
	}
}

func TestDataDirIsLocked(t *testing.T) {
	cfg := testConfig(t.TempDir())
	s := mustOpen(t, cfg, options{})
	if _, err := Open(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "in use by another store") {
		t.Fatalf("second open of a data dir in use = %v", err)
	}
	s.Close()
	s2, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	s2.Close()
}

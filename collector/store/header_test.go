package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks"
)

// headerLog writes 6,000 occurrences in 64 KiB segments (as in issue 21)
// and returns the config and the segment files, oldest first.
func headerLog(t *testing.T) (Config, []string) {
	t.Helper()
	cfg := testConfig(t.TempDir())
	cfg.SegmentBytes = 64 << 10
	cfg.Fsync = false
	s := mustOpen(t, cfg, options{})
	for b := range 60 {
		if _, err := s.Append(context.Background(), "c", "events", "", occs(1+b*100, 100)); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	segs, _ := filepath.Glob(filepath.Join(cfg.Dir, "log", "*.seg"))
	if len(segs) < 10 {
		t.Fatalf("want many segments, got %d", len(segs))
	}
	return cfg, segs
}

// flipBit flips bit 0 of byte at of path.
func flipBit(t *testing.T, path string, at int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x01
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// readEvery reads the whole log and checks it holds occurrences 1..n, each
// at its own offset.
func readEvery(t *testing.T, s *Store, n int) {
	t.Helper()
	recs, _, err := s.Read(context.Background(), 1, 2*n)
	if err != nil {
		t.Fatalf("read after %d of %d records: %v", len(recs), n, err)
	}
	if len(recs) != n {
		t.Fatalf("read %d records, want %d", len(recs), n)
	}
	for _, r := range recs {
		if r.Occurrence.GetEventId() != occ(int(r.Offset)).GetEventId() {
			t.Fatalf("offset %d holds %s", r.Offset, r.Occurrence.GetEventId())
		}
	}
}

// headerLoss checks that the only loss found is the named segment's header,
// costing no record.
func headerLoss(t *testing.T, s *Store, seg string) {
	t.Helper()
	l := s.DataLoss()
	if len(l) != 1 || l[0].Segment != filepath.Base(seg) || l[0].To >= l[0].From || !strings.Contains(l[0].Reason, "header") {
		t.Fatalf("DataLoss = %+v, want the header of %s (no record)", l, filepath.Base(seg))
	}
}

// refusedThenAccepted checks that the store refuses to open with seg's
// header damaged, naming it, then opens it accepting the loss and checks
// that the loss is the header's (no record, 16 bytes counted).
func refusedThenAccepted(t *testing.T, cfg Config, seg string) (*Store, *prometheus.Registry) {
	t.Helper()
	_, err := openWith(cfg, nil, nil, options{})
	if !errors.Is(err, ErrDataLoss) || !strings.Contains(err.Error(), filepath.Base(seg)) {
		t.Fatalf("open with a damaged header: %v, want ErrDataLoss naming %s", err, filepath.Base(seg))
	}
	accept := cfg
	accept.AcceptDataLoss = true
	reg := prometheus.NewRegistry()
	s, err := openWith(accept, nil, reg, options{})
	if err != nil {
		t.Fatalf("open accepting data loss: %v", err)
	}
	headerLoss(t, s, seg)
	if got := gathered(t, reg, "eventpipe_collector_log_data_loss_bytes_total"); got != 16 {
		s.Close()
		t.Fatalf("data_loss_bytes_total = %v, want 16", got)
	}
	return s, reg
}

// Issue 21, defect 1, first case: one bit flipped in byte 0 of a middle
// segment inside the dedupe window. The start used to be impossible even
// with accept_data_loss ("rebuild dedupe index ...: bad header"). Now the
// damaged header is refused like a damaged frame, named; accepted, every
// record is kept (the frames carry their offsets and checksums), the header
// is rewritten and the next start is clean.
func TestDamagedHeaderOfASealedSegmentInsideTheDedupeWindow(t *testing.T) {
	cfg, segs := headerLog(t)
	seg := segs[len(segs)/2]
	flipBit(t, seg, 0)

	s, _ := refusedThenAccepted(t, cfg, seg)
	readEvery(t, s, 6000)
	s.Close()

	s2, err := openWith(cfg, nil, nil, options{})
	if err != nil {
		t.Fatalf("open after the accepted repair: %v", err)
	}
	defer s2.Close()
	if l := s2.DataLoss(); len(l) != 0 {
		t.Fatalf("the repaired header is found damaged again: %+v", l)
	}
	readEvery(t, s2, 6000)
}

// Second case: the same segment outside the dedupe window, first read by a
// new consumer while running. The reader used to stop there for ever
// (2,500 of 6,000, nothing counted). Now the reader goes on through the
// frames and the damage is named and counted as it is found.
func TestDamagedHeaderFoundByAReaderLater(t *testing.T) {
	cfg, segs := headerLog(t)
	seg := segs[len(segs)/2]
	flipBit(t, seg, 0)

	later := func() time.Time { return time.Now().Add(2 * cfg.DedupeWindow) }
	reg := prometheus.NewRegistry()
	s, err := openWith(cfg, nil, reg, options{now: later})
	if err != nil {
		t.Fatalf("open (the segment is outside the dedupe window): %v", err)
	}
	defer s.Close()
	readEvery(t, s, 6000)
	headerLoss(t, s, seg)
	if got := gathered(t, reg, "eventpipe_collector_log_data_loss_bytes_total"); got != 16 {
		t.Fatalf("data_loss_bytes_total = %v, want 16", got)
	}
}

// Third case: the last segment, which no consumer committed yet. It used to
// be dropped whole as a "torn, unacknowledged tail" with nothing counted,
// although its frames were intact and acknowledged to the agents. A
// header is fsynced before any frame is written, so a damaged header in
// front of frames is fsynced data the disk altered: refused, and accepted,
// every record is kept and new records follow them.
func TestDamagedHeaderOfTheLastSegmentIsNotATornTail(t *testing.T) {
	cfg, segs := headerLog(t)
	seg := segs[len(segs)-1]
	flipBit(t, seg, 0)

	s, reg := refusedThenAccepted(t, cfg, seg)
	if r := s.Repaired(); r.Records != 0 || r.TornFrom != 0 {
		t.Fatalf("intact acknowledged records repaired away as a torn tail: %+v", r)
	}
	if got := gathered(t, reg, "eventpipe_collector_log_repaired_records_total"); got != 0 {
		t.Fatalf("repaired_records_total = %v, want 0", got)
	}
	readEvery(t, s, 6000)
	res, err := s.Append(context.Background(), "c", "events", "", occs(6001, 1))
	if err != nil || res.LastOffset != 6001 {
		t.Fatalf("append after the repair: %+v %v", res, err)
	}
	s.Close()
	s2, err := openWith(cfg, nil, nil, options{})
	if err != nil {
		t.Fatalf("open after the accepted repair: %v", err)
	}
	defer s2.Close()
	readEvery(t, s2, 6001)
}

// Readable names the lowest offset a read could not get past and forgets
// it once a read got past it (what /readyz shows).
func TestReadableTracksWhereReadsAreStuck(t *testing.T) {
	recs := func(offs ...uint64) []sinks.Record {
		out := make([]sinks.Record, len(offs))
		for i, o := range offs {
			out[i] = sinks.Record{Offset: o}
		}
		return out
	}
	errBad := errors.New("decode record: bad")
	type read struct {
		from uint64
		out  []sinks.Record
		err  error
	}
	for _, tc := range []struct {
		name  string
		reads []read
		stuck string // "" = readable
	}{
		{"healthy", []read{{1, recs(1, 2), nil}}, ""},
		{"failing at the start", []read{{1, nil, errBad}}, "offset 1"},
		{"failing after some records", []read{{1, recs(1, 2), errBad}}, "offset 3"},
		{"retried and still failing", []read{{1, recs(1, 2), errBad}, {3, nil, errBad}}, "offset 3"},
		{"a read before it that stops short", []read{{3, nil, errBad}, {1, recs(1), nil}}, "offset 3"},
		{"a read gets past it", []read{{3, nil, errBad}, {3, recs(4), nil}}, ""},
		{"the lowest one wins", []read{{7, nil, errBad}, {3, nil, errBad}, {7, recs(8), nil}}, "offset 3"},
		{"closed is not stuck", []read{{1, nil, ErrClosed}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{}
			for _, r := range tc.reads {
				s.noteRead(r.from, r.out, r.err)
			}
			err := s.Readable()
			if tc.stuck == "" && err != nil || tc.stuck != "" && (err == nil || !strings.Contains(err.Error(), tc.stuck+":")) {
				t.Fatalf("Readable = %v, want %q", err, tc.stuck)
			}
		})
	}
}

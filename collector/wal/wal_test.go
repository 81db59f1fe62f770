package wal

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rec(i int) []byte {
	return []byte(fmt.Sprintf("record-%06d-%s", i, bytes.Repeat([]byte{'x'}, i%37)))
}

func mustOpen(t *testing.T, dir string, o Options) *WAL {
	t.Helper()
	w, err := Open(dir, o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func appendN(t *testing.T, w *WAL, from, n, batch int) {
	t.Helper()
	for i := from; i < from+n; i += batch {
		var recs [][]byte
		for j := i; j < from+n && j < i+batch; j++ {
			recs = append(recs, rec(j))
		}
		first, last, err := w.Append(recs)
		if err != nil {
			t.Fatalf("append at %d: %v", i, err)
		}
		if first != uint64(i) || last != uint64(i+len(recs)-1) {
			t.Fatalf("append at %d: got offsets %d..%d", i, first, last)
		}
	}
}

func checkAll(t *testing.T, w *WAL, first, last int) {
	t.Helper()
	got, err := w.Read(uint64(first), last-first+10)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if len(got) != last-first+1 {
		t.Fatalf("read %d records, want %d", len(got), last-first+1)
	}
	for k, e := range got {
		if e.Offset != uint64(first+k) || !bytes.Equal(e.Data, rec(first+k)) {
			t.Fatalf("record %d: offset %d data %q", first+k, e.Offset, e.Data)
		}
	}
}

func TestAppendReadAcrossSegmentsAndReopen(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir, Options{SegmentBytes: 1024})
	if f, l := w.Bounds(); f != 1 || l != 0 {
		t.Fatalf("empty bounds = %d,%d", f, l)
	}
	appendN(t, w, 1, 500, 7)
	if n := len(w.Segments()); n < 10 {
		t.Fatalf("want many segments with 1 KiB segments, got %d", n)
	}
	checkAll(t, w, 1, 500)
	// Every start offset, across index strides and segment boundaries.
	for from := 1; from <= 500; from += 13 {
		got, err := w.Read(uint64(from), 3)
		if err != nil || len(got) != min(3, 501-from) || got[0].Offset != uint64(from) || !bytes.Equal(got[0].Data, rec(from)) {
			t.Fatalf("read from %d: %v %v", from, got, err)
		}
	}
	if got, _ := w.Read(501, 10); len(got) != 0 {
		t.Fatalf("read past the end returned %d records", len(got))
	}
	segs := w.Segments()
	for i := 1; i < len(segs); i++ {
		if segs[i].First != segs[i-1].Last+1 {
			t.Fatalf("segments not contiguous: %+v", segs)
		}
		if segs[i-1].Bytes > 1024 {
			t.Fatalf("segment %s has %d bytes, over SegmentBytes", segs[i-1].Name, segs[i-1].Bytes)
		}
	}
	w.Close()

	w2 := mustOpen(t, dir, Options{SegmentBytes: 1024})
	if r := w2.Repaired(); r.Bytes != 0 || r.Records != 0 {
		t.Fatalf("clean reopen repaired %+v", r)
	}
	if f, l := w2.Bounds(); f != 1 || l != 500 {
		t.Fatalf("bounds after reopen = %d,%d", f, l)
	}
	appendN(t, w2, 501, 100, 10)
	checkAll(t, w2, 1, 600)
}

func TestOneRecordLargerThanSegment(t *testing.T) {
	w := mustOpen(t, t.TempDir(), Options{SegmentBytes: 64})
	big := bytes.Repeat([]byte{'b'}, 500)
	for i := range 3 {
		if _, last, err := w.Append([][]byte{big}); err != nil || last != uint64(i+1) {
			t.Fatalf("append big: %d %v", last, err)
		}
	}
	if n := len(w.Segments()); n != 3 {
		t.Fatalf("want one segment per oversized record, got %d", n)
	}
}

func TestRejectsBadRecords(t *testing.T) {
	w := mustOpen(t, t.TempDir(), Options{MaxRecordBytes: 100})
	for _, recs := range [][][]byte{{{}}, {bytes.Repeat([]byte{1}, 101)}} {
		if _, _, err := w.Append(recs); err == nil {
			t.Fatalf("append of %d-byte record accepted", len(recs[0]))
		}
	}
	if err := w.Err(); err != nil {
		t.Fatalf("bad input made the wal unwritable: %v", err)
	}
}

func TestGroupCommitSharesFsyncs(t *testing.T) {
	fs := &faultFS{}
	w := mustOpen(t, t.TempDir(), Options{FS: fs})
	base := fs.syncs.Load()
	const writers, per = 16, 50
	var wg sync.WaitGroup
	offsets := make(chan uint64, writers*per*2)
	errs := make(chan error, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				first, last, err := w.Append([][]byte{rec(g*1000 + i), rec(g*1000 + i + 500)})
				if err != nil {
					errs <- err
					return
				}
				if last != first+1 {
					errs <- fmt.Errorf("offsets %d..%d not consecutive", first, last)
					return
				}
				offsets <- first
				offsets <- last
			}
		}()
	}
	wg.Wait()
	close(offsets)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for o := range offsets {
		if seen[o] {
			t.Fatalf("offset %d handed out twice", o)
		}
		seen[o] = true
	}
	if len(seen) != writers*per*2 {
		t.Fatalf("got %d offsets", len(seen))
	}
	for o := uint64(1); o <= writers*per*2; o++ {
		if !seen[o] {
			t.Fatalf("offset %d missing: offsets not dense", o)
		}
	}
	syncs := fs.syncs.Load() - base
	t.Logf("%d appends, %d fsyncs", writers*per, syncs)
	if syncs >= writers*per {
		t.Fatalf("%d fsyncs for %d appends: no group commit", syncs, writers*per)
	}
}

// segPath returns the path of the only or last segment.
func lastSeg(t *testing.T, dir string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(m) == 0 {
		t.Fatal("no segment")
	}
	return m[len(m)-1]
}

func TestRepairTail(t *testing.T) {
	// 10 records of known size each, written in rounds of 3: [1-3] [4-6]
	// [7-9] [10]. rec(i) is 14 + i%37 bytes.
	frameEnd := func(n int) int64 { // file offset after n records
		p := int64(headerSize)
		for i := 1; i <= n; i++ {
			p += int64(frameHeaderV2 + len(rec(i)))
		}
		return p
	}
	cases := []struct {
		name    string
		damage  func(t *testing.T, path string)
		acked   uint64 // Options.AckedThrough: a consumer's cursor
		records int    // torn (unacknowledged) records dropped
		bytes   int64
		through uint64   // offsets skipped up to here (0: none)
		lost    []uint64 // acknowledged offsets lost (refused without AcceptDataLoss)
		lastRec uint64   // last record left
	}{
		{"intact", func(*testing.T, string) {}, 10, 0, 0, 0, nil, 10},
		{"truncated last record", func(t *testing.T, p string) {
			os.Truncate(p, frameEnd(10)-3)
		}, 0, 1, frameEnd(10) - 3 - frameEnd(9), 10, nil, 9},
		{"truncated inside frame header", func(t *testing.T, p string) {
			os.Truncate(p, frameEnd(9)+5)
		}, 0, 1, 5, 10, nil, 9},
		{"bad checksum in last record", func(t *testing.T, p string) {
			flip(t, p, frameEnd(10)-1)
		}, 0, 1, frameEnd(10) - frameEnd(9), 10, nil, 9},
		{"truncated last record a consumer committed", func(t *testing.T, p string) {
			os.Truncate(p, frameEnd(10)-5)
		}, 10, 0, 0, 10, []uint64{10}, 9},
		{"whole records missing at the end, consumer ahead", func(t *testing.T, p string) {
			os.Truncate(p, frameEnd(8))
		}, 10, 0, 0, 10, []uint64{9, 10}, 8},
		{"bad checksum in record 7 of 10 (written before record 10's round)", func(t *testing.T, p string) {
			flip(t, p, frameEnd(6)+frameHeaderV2+2)
		}, 0, 0, 0, 0, []uint64{7}, 10},
		{"corrupt length of record 5", func(t *testing.T, p string) {
			flip(t, p, frameEnd(4)+1)
		}, 0, 0, 0, 0, []uint64{5}, 10},
		{"garbage tail", func(t *testing.T, p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write([]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9})
			f.Close()
		}, 0, 1, 13, 11, nil, 10},
		{"zeroed tail (preallocated blocks)", func(t *testing.T, p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write(make([]byte, 4096))
			f.Close()
		}, 0, 1, 4096, 11, nil, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w := mustOpen(t, dir, Options{})
			appendN(t, w, 1, 10, 3)
			w.Close()
			tc.damage(t, lastSeg(t, dir))
			before := snapshot(t, dir)
			if len(tc.lost) > 0 {
				_, err := Open(dir, Options{AckedThrough: tc.acked})
				var dl *DataLossError
				if !errors.As(err, &dl) || !errors.Is(err, ErrDataLoss) || lostRecords(dl.Lost) != uint64(len(tc.lost)) {
					t.Fatalf("open without AcceptDataLoss: %v, want a DataLossError for %d records", err, len(tc.lost))
				}
				if after := snapshot(t, dir); after != before {
					t.Fatalf("a refused open modified the log:\n%s\n%s", before, after)
				}
			}
			reg := prometheus.NewRegistry()
			w2 := mustOpen(t, dir, Options{Registerer: reg, AckedThrough: tc.acked, AcceptDataLoss: true})
			r := w2.Repaired()
			if r.Records != tc.records || r.Bytes != tc.bytes || r.Through != tc.through || r.LostRecords() != uint64(len(tc.lost)) {
				t.Fatalf("repair = %+v, want %d torn records, %d bytes, through %d, %d lost", r, tc.records, tc.bytes, tc.through, len(tc.lost))
			}
			if got := counterValue(w2.m.repairedRecords); got != float64(tc.records) {
				t.Fatalf("repaired_records_total = %v", got)
			}
			if got := counterValue(w2.m.lostRecords); got != float64(len(tc.lost)) {
				t.Fatalf("data_loss_records_total = %v", got)
			}
			gone := map[uint64]bool{}
			for _, o := range tc.lost {
				gone[o] = true
			}
			_, last := w2.Bounds()
			for o := tc.lastRec + 1; o <= tc.through; o++ {
				gone[o] = true // skipped offsets hold no record
			}
			if want := max(tc.lastRec, tc.through); last != want {
				t.Fatalf("last after repair = %d, want %d", last, want)
			}
			if w2.LastRecord() != tc.lastRec {
				t.Fatalf("LastRecord = %d, want %d", w2.LastRecord(), tc.lastRec)
			}
			checkExcept(t, w2, 1, tc.lastRec, gone)
			// Appends continue after every offset the log may have handed out.
			appendN(t, w2, int(last)+1, 5, 5)
			if got, _ := w2.Read(tc.lastRec+1, 10); len(got) != 5 || got[0].Offset != last+1 {
				t.Fatalf("read after the repaired end: %v", got)
			}
			w2.Close()
			w3 := mustOpen(t, dir, Options{AckedThrough: tc.acked})
			if r := w3.Repaired(); r.Bytes != 0 || len(r.Lost) != 0 || r.Through != 0 {
				t.Fatalf("second reopen repaired again: %+v", r)
			}
			checkExcept(t, w3, 1, last+5, gone)
		})
	}
}

// checkExcept reads first..last and wants every record but the gone ones
// (and offsets above the last record of a repaired tail), each intact.
func checkExcept(t *testing.T, w *WAL, first, last uint64, gone map[uint64]bool) {
	t.Helper()
	got, err := w.Read(first, int(last-first)+10)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	i := 0
	for o := first; o <= last; o++ {
		if gone[o] {
			continue
		}
		for i < len(got) && got[i].Offset < o {
			if !bytes.Equal(got[i].Data, rec(int(got[i].Offset))) {
				t.Fatalf("record %d is not the original", got[i].Offset)
			}
			i++
		}
		if i >= len(got) || got[i].Offset != o || !bytes.Equal(got[i].Data, rec(int(o))) {
			t.Fatalf("offset %d missing or altered (read %d records)", o, len(got))
		}
		i++
	}
	for _, e := range got {
		if gone[e.Offset] {
			t.Fatalf("lost offset %d was read", e.Offset)
		}
	}
}

// snapshot describes every file of dir (names, sizes, contents' checksum).
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*"))
	var b strings.Builder
	for _, p := range m {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %d %x\n", filepath.Base(p), len(data), crc32.ChecksumIEEE(data))
	}
	return b.String()
}

func flip(t *testing.T, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	f.ReadAt(b, at)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

func TestRepairEmptySegments(t *testing.T) {
	t.Run("empty last segment after a full one", func(t *testing.T) {
		dir := t.TempDir()
		w := mustOpen(t, dir, Options{})
		appendN(t, w, 1, 10, 10)
		w.Close()
		// A crash right after creating the next segment file.
		os.WriteFile(filepath.Join(dir, segmentName(11)), nil, 0o640)
		w2 := mustOpen(t, dir, Options{})
		if _, last := w2.Bounds(); last != 10 {
			t.Fatalf("last = %d", last)
		}
		appendN(t, w2, 11, 3, 3)
		checkAll(t, w2, 1, 13)
	})
	t.Run("only segment with a torn header", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, segmentName(1)), []byte("EPW"), 0o640)
		w := mustOpen(t, dir, Options{})
		if r := w.Repaired(); r.Bytes != 3 {
			t.Fatalf("repair = %+v", r)
		}
		appendN(t, w, 1, 3, 3)
		checkAll(t, w, 1, 3)
	})
	t.Run("empty directory", func(t *testing.T) {
		w := mustOpen(t, filepath.Join(t.TempDir(), "new"), Options{})
		appendN(t, w, 1, 2, 2)
	})
}

// A damaged record in a sealed segment (found when the segment is first
// read) is skipped, counted and logged as lost acknowledged data; the
// records after it are read.
func TestCorruptSealedSegmentLosesOnlyTheDamagedRecord(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir, Options{SegmentBytes: 256})
	appendN(t, w, 1, 50, 1)
	w.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	flip(t, segs[0], headerSize+frameHeaderV2+1) // payload of record 1
	w2 := mustOpen(t, dir, Options{SegmentBytes: 256})
	got, err := w2.Read(1, 100)
	if err != nil || len(got) != 49 || got[0].Offset != 2 {
		t.Fatalf("read after a corrupt record in a sealed segment: %d records from %v: %v", len(got), got[0].Offset, err)
	}
	checkExcept(t, w2, 1, 50, map[uint64]bool{1: true})
	if l := w2.Lost(); len(l) != 1 || l[0].From != 1 || l[0].To != 1 {
		t.Fatalf("lost = %+v", l)
	}
	if got := counterValue(w2.m.lostRecords); got != 1 {
		t.Fatalf("data_loss_records_total = %v", got)
	}
}

func TestRetention(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	w := mustOpen(t, t.TempDir(), Options{SegmentBytes: 512, Now: clock})
	appendN(t, w, 1, 100, 5)
	segs := w.Segments()
	if len(segs) < 6 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	// Size: a bound one byte above "all but the two oldest" removes exactly
	// the two oldest segments.
	total := w.Size()
	removed, err := w.Retain(total-segs[0].Bytes-segs[1].Bytes+1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 || removed[0].First != 1 || removed[1].Last != segs[1].Last {
		t.Fatalf("size retention removed %+v", removed)
	}
	if first, _ := w.Bounds(); first != segs[2].First {
		t.Fatalf("first after retention = %d, want %d", first, segs[2].First)
	}
	if w.Size() > total-segs[0].Bytes-segs[1].Bytes {
		t.Fatalf("size %d after retention", w.Size())
	}
	got, err := w.Read(1, 5)
	if err != nil || len(got) == 0 || got[0].Offset != segs[2].First {
		t.Fatalf("read from 1 after retention: %v %v", got, err)
	}
	// Age: everything but the active segment is older than 1h in 2h.
	now = now.Add(2 * time.Hour)
	appendN(t, w, 101, 1, 1) // the active segment is fresh
	removed, err = w.Retain(0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if rest := w.Segments(); len(rest) != 1 {
		t.Fatalf("age retention left %d segments (removed %d)", len(rest), len(removed))
	}
	// Never the active one, even when over every bound.
	removed, _ = w.Retain(1, time.Nanosecond)
	if len(removed) != 0 {
		t.Fatalf("retention removed the active segment")
	}
	if _, last := w.Bounds(); last != 101 {
		t.Fatalf("last = %d", last)
	}
}

func TestFaultsRefuseAppendsUntilReopened(t *testing.T) {
	cases := []struct {
		name  string
		fault func(*faultFS)
	}{
		{"failed write", func(f *faultFS) { f.failWrite = true }},
		{"short write", func(f *faultFS) { f.shortWrite = true }},
		{"failed fsync", func(f *faultFS) { f.failSync = true }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fs := &faultFS{}
			w := mustOpen(t, dir, Options{FS: fs})
			appendN(t, w, 1, 10, 5)
			fs.set(tc.fault)
			if _, _, err := w.Append([][]byte{rec(11), rec(12)}); !errors.Is(err, ErrNotWritable) {
				t.Fatalf("append under fault: %v, want ErrNotWritable", err)
			}
			if _, last := w.Bounds(); last != 10 {
				t.Fatalf("unsynced records became visible: last = %d", last)
			}
			if got, _ := w.Read(11, 5); len(got) != 0 {
				t.Fatalf("read returned %d unacknowledged records", len(got))
			}
			fs.set(func(f *faultFS) { f.failWrite, f.shortWrite, f.failSync = false, false, false })
			if _, _, err := w.Append([][]byte{rec(11)}); !errors.Is(err, ErrNotWritable) {
				t.Fatalf("append after the fault cleared, before reopen: %v", err)
			}
			if err := w.Err(); !errors.Is(err, ErrNotWritable) {
				t.Fatalf("Err() = %v", err)
			}
			w.Close()
			w2 := mustOpen(t, dir, Options{})
			_, last := w2.Bounds()
			// A failed fsync may leave the records in the file: they were
			// never acknowledged, but they are intact, so they stay.
			if last < 10 || last > 12 {
				t.Fatalf("last after reopen = %d", last)
			}
			checkAll(t, w2, 1, int(last))
			appendN(t, w2, int(last)+1, 3, 3)
		})
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// Any truncation, byte flip or junk in the last segment opens (with
// AcceptDataLoss) and keeps every record that was not damaged, each
// byte-identical at its original offset, never garbage.
func TestRepairRandomDamageKeepsEveryIntactRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := t.TempDir()
	w := mustOpen(t, src, Options{})
	appendN(t, w, 1, 40, 4)
	w.Close()
	orig, err := os.ReadFile(lastSeg(t, src))
	if err != nil {
		t.Fatal(err)
	}
	// ends[i]: file position after record i+1.
	var ends []int
	for p, i := headerSize, 1; i <= 40; i++ {
		p += frameHeaderV2 + len(rec(i))
		ends = append(ends, p)
	}
	for iter := range 300 {
		dir := t.TempDir()
		b := append([]byte(nil), orig...)
		var touched []int // damaged positions
		switch iter % 3 {
		case 0:
			n := rng.IntN(len(b) + 1)
			b = b[:n]
			touched = append(touched, n)
		case 1:
			for range 1 + rng.IntN(3) {
				at := headerSize + rng.IntN(len(b)-headerSize)
				b[at] ^= byte(1 + rng.IntN(255))
				touched = append(touched, at)
			}
		case 2:
			junk := make([]byte, rng.IntN(100))
			for i := range junk {
				junk[i] = byte(rng.IntN(256))
			}
			at := headerSize + rng.IntN(len(b)-headerSize)
			b = append(b[:at], junk...)
			touched = append(touched, at)
		}
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), b, 0o640); err != nil {
			t.Fatal(err)
		}
		w, err := Open(dir, Options{AcceptDataLoss: true, NoSync: true})
		if err != nil {
			t.Fatalf("iteration %d: open: %v", iter, err)
		}
		got, err := w.Read(1, 100)
		if err != nil {
			w.Close()
			t.Fatalf("iteration %d: read: %v", iter, err)
		}
		have := map[uint64]bool{}
		for _, e := range got {
			if !bytes.Equal(e.Data, rec(int(e.Offset))) {
				w.Close()
				t.Fatalf("iteration %d: record %d is not the original", iter, e.Offset)
			}
			have[e.Offset] = true
		}
		// A record is intact when no damage touched its bytes and, for a
		// cut or junk, it ends before the cut.
		for i, end := range ends {
			start := headerSize
			if i > 0 {
				start = ends[i-1]
			}
			intact := end <= len(b)
			for _, at := range touched {
				if at >= start && at < end {
					intact = false
				}
			}
			if iter%3 == 2 && end > touched[0] {
				intact = false
			}
			if intact && !have[uint64(i+1)] {
				w.Close()
				t.Fatalf("iteration %d: intact record %d lost (damage at %v)", iter, i+1, touched)
			}
		}
		_, last := w.Bounds()
		if _, _, err := w.Append([][]byte{rec(int(last) + 1)}); err != nil {
			w.Close()
			t.Fatalf("iteration %d: append after repair: %v", iter, err)
		}
		if got, _ := w.Read(last+1, 1); len(got) != 1 || got[0].Offset != last+1 {
			w.Close()
			t.Fatalf("iteration %d: appended record not read back: %v", iter, got)
		}
		w.Close()
	}
}

package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
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
	// 10 records of known size each: rec(i) is 14 + i%37 bytes.
	frameEnd := func(n int) int64 { // file offset after n records
		p := int64(headerSize)
		for i := 1; i <= n; i++ {
			p += int64(frameHeaderSize + len(rec(i)))
		}
		return p
	}
	cases := []struct {
		name        string
		damage      func(t *testing.T, path string)
		wantLast    uint64
		wantRecords int
		wantBytes   int64
	}{
		{"intact", func(*testing.T, string) {}, 10, 0, 0},
		{"truncated last record", func(t *testing.T, p string) {
			os.Truncate(p, frameEnd(10)-3)
		}, 9, 1, frameEnd(10) - 3 - frameEnd(9)},
		{"truncated inside frame header", func(t *testing.T, p string) {
			os.Truncate(p, frameEnd(9)+5)
		}, 9, 1, 5},
		{"bad checksum in last record", func(t *testing.T, p string) {
			flip(t, p, frameEnd(10)-1)
		}, 9, 1, frameEnd(10) - frameEnd(9)},
		{"bad checksum in record 7 of 10", func(t *testing.T, p string) {
			flip(t, p, frameEnd(6)+frameHeaderSize+2)
		}, 6, 4, frameEnd(10) - frameEnd(6)},
		{"garbage tail", func(t *testing.T, p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write([]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9})
			f.Close()
		}, 10, 1, 13},
		{"zeroed tail (preallocated blocks)", func(t *testing.T, p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write(make([]byte, 4096))
			f.Close()
		}, 10, 1, 4096},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w := mustOpen(t, dir, Options{})
			appendN(t, w, 1, 10, 3)
			w.Close()
			tc.damage(t, lastSeg(t, dir))
			reg := prometheus.NewRegistry()
			w2 := mustOpen(t, dir, Options{Registerer: reg})
			r := w2.Repaired()
			if r.Records != tc.wantRecords || r.Bytes != tc.wantBytes {
				t.Fatalf("repair = %+v, want %d records %d bytes", r, tc.wantRecords, tc.wantBytes)
			}
			if got := counterValue(w2.m.repairedRecords); got != float64(tc.wantRecords) {
				t.Fatalf("repaired_records_total = %v", got)
			}
			if _, last := w2.Bounds(); last != tc.wantLast {
				t.Fatalf("last after repair = %d, want %d", last, tc.wantLast)
			}
			checkAll(t, w2, 1, int(tc.wantLast))
			// Appends continue right after the last good record.
			appendN(t, w2, int(tc.wantLast)+1, 5, 5)
			checkAll(t, w2, 1, int(tc.wantLast)+5)
			w2.Close()
			w3 := mustOpen(t, dir, Options{})
			if r := w3.Repaired(); r.Bytes != 0 {
				t.Fatalf("second reopen repaired again: %+v", r)
			}
		})
	}
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

func TestCorruptSealedSegmentIsAReadError(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir, Options{SegmentBytes: 256})
	appendN(t, w, 1, 50, 1)
	w.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	flip(t, segs[0], headerSize+frameHeaderSize+1)
	w2 := mustOpen(t, dir, Options{SegmentBytes: 256})
	if _, err := w2.Read(1, 10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a corrupt sealed segment: %v, want ErrCorrupt", err)
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

// Any truncation or byte flip in the last segment opens cleanly and keeps a
// prefix of the original records, each byte-identical, never garbage.
func TestRepairRandomDamageKeepsAnIntactPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := t.TempDir()
	w := mustOpen(t, src, Options{})
	appendN(t, w, 1, 40, 4)
	w.Close()
	orig, err := os.ReadFile(lastSeg(t, src))
	if err != nil {
		t.Fatal(err)
	}
	for iter := range 200 {
		dir := t.TempDir()
		b := append([]byte(nil), orig...)
		switch iter % 3 {
		case 0:
			b = b[:rng.IntN(len(b)+1)]
		case 1:
			for range 1 + rng.IntN(3) {
				b[headerSize+rng.IntN(len(b)-headerSize)] ^= byte(1 + rng.IntN(255))
			}
		case 2:
			junk := make([]byte, rng.IntN(100))
			for i := range junk {
				junk[i] = byte(rng.IntN(256))
			}
			b = append(b[:headerSize+rng.IntN(len(b)-headerSize)], junk...)
		}
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), b, 0o640); err != nil {
			t.Fatal(err)
		}
		w, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("iteration %d: open: %v", iter, err)
		}
		_, last := w.Bounds()
		got, err := w.Read(1, 100)
		if err != nil || uint64(len(got)) != last {
			w.Close()
			t.Fatalf("iteration %d: read %d of %d: %v", iter, len(got), last, err)
		}
		for _, e := range got {
			if !bytes.Equal(e.Data, rec(int(e.Offset))) {
				w.Close()
				t.Fatalf("iteration %d: record %d is not the original", iter, e.Offset)
			}
		}
		if r := w.Repaired(); int64(len(b))-r.Bytes < headerSize && len(b) >= headerSize {
			w.Close()
			t.Fatalf("iteration %d: repair dropped into the header: %+v", iter, r)
		}
		if _, _, err := w.Append([][]byte{rec(int(last) + 1)}); err != nil {
			w.Close()
			t.Fatalf("iteration %d: append after repair: %v", iter, err)
		}
		w.Close()
	}
}

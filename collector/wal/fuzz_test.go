package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
)

// The fuzz targets check one invariant of recovery (issue 21): every record
// with a valid frame and checksum is recovered or counted as lost, never
// silently dropped; nothing else is ever returned as a record; and an
// accepted repair is final (the next open finds nothing new and reads the
// same records). Their seed corpora are in testdata/fuzz and run in plain
// go test; `go test -fuzz FuzzSegmentFlips ./collector/wal/` explores more.

const fuzzDir = "/log"

// fuzzLog is a log written by the WAL itself: 80 records in batches of 1 to
// 7 (so round starts fall in several places), in segments of about 700
// bytes. spans[o] is where record o's frame lies: file and byte range.
type fuzzLog struct {
	files map[string][]byte
	names []string
	spans map[uint64]fuzzSpan
	n     uint64
	total int
}

type fuzzSpan struct {
	file       string
	start, end int
}

var fuzzTemplate = sync.OnceValues(func() (*fuzzLog, error) {
	m := newMemFS()
	w, err := Open(fuzzDir, Options{FS: m, SegmentBytes: 700})
	if err != nil {
		return nil, err
	}
	for i, b := 1, 1; i <= 80; i, b = i+b, b%7+1 {
		var recs [][]byte
		for j := i; j < i+b && j <= 80; j++ {
			recs = append(recs, rec(j))
		}
		if _, _, err := w.Append(recs); err != nil {
			w.Close()
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	l := &fuzzLog{files: map[string][]byte{}, spans: map[uint64]fuzzSpan{}, n: 80}
	for _, p := range m.names(fuzzDir, segmentSuffix) {
		b, _ := m.get(p)
		name := filepath.Base(p)
		l.files[name] = b
		l.names = append(l.names, name)
		l.total += len(b)
		for pos := headerSize; pos < len(b); {
			fm, ok := parseFrame(b[pos:], DefaultMaxRecordBytes)
			if !ok {
				return nil, fmt.Errorf("template segment %s: no frame at %d", name, pos)
			}
			l.spans[fm.off] = fuzzSpan{name, pos, pos + fm.size}
			pos += fm.size
		}
	}
	if uint64(len(l.spans)) != l.n || len(l.names) < 4 {
		return nil, fmt.Errorf("template: %d records in %d segments", len(l.spans), len(l.names))
	}
	return l, nil
})

// counted reports whether offset off is accounted for: inside a loss of
// acknowledged data, or at or after the first offset of a torn write
// (counted in repaired_records_total).
func counted(w *WAL, off uint64) bool {
	for _, l := range w.Lost() {
		if l.From <= off && off <= l.To {
			return true
		}
	}
	r := w.Repaired()
	return r.TornFrom > 0 && off >= r.TornFrom && r.Records > 0
}

// recoverAll opens the log in m accepting data loss and reads every record
// (at most limit: a log of n bytes holds at most n/17 records).
func recoverAll(t *testing.T, m *memFS, acked uint64, limit int) (*WAL, []Entry) {
	t.Helper()
	w, err := Open(fuzzDir, Options{FS: m, AcceptDataLoss: true, AckedThrough: acked})
	if err != nil {
		t.Fatalf("open accepting data loss: %v", err)
	}
	got, err := w.Read(1, limit)
	if err != nil {
		w.Close()
		t.Fatalf("read after an accepted repair: %v", err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Offset <= got[i-1].Offset {
			w.Close()
			t.Fatalf("offsets not increasing: %d then %d", got[i-1].Offset, got[i].Offset)
		}
	}
	return w, got
}

// repairIsFinal rewrites what the accepted open found, reopens without
// accepting anything and checks that the same records are read, that no
// loss is found again, and that a new record gets an offset above every
// offset in use (never one handed out before).
func repairIsFinal(t *testing.T, m *memFS, w *WAL, got []Entry, acked uint64) {
	t.Helper()
	if err := w.RewriteDamaged(); err != nil {
		w.Close()
		t.Fatalf("rewrite damaged segments: %v", err)
	}
	w.Close()
	w2, err := Open(fuzzDir, Options{FS: m, AckedThrough: acked})
	if err != nil {
		t.Fatalf("open after the accepted repair: %v", err)
	}
	defer w2.Close()
	again, err := w2.Read(1, len(got)+1)
	if err != nil || len(again) != len(got) {
		t.Fatalf("after the repair: %d records (%v), want %d", len(again), err, len(got))
	}
	for i := range again {
		if again[i].Offset != got[i].Offset || !bytes.Equal(again[i].Data, got[i].Data) {
			t.Fatalf("after the repair, record %d changed", got[i].Offset)
		}
	}
	if l := w2.Lost(); len(l) != 0 {
		t.Fatalf("after the repair, loss found again: %+v", l)
	}
	first, _, err := w2.Append([][]byte{[]byte("after the repair")})
	if err != nil {
		t.Fatalf("append after the repair: %v", err)
	}
	floor := acked
	if len(got) > 0 {
		floor = max(floor, got[len(got)-1].Offset)
	}
	if first <= floor {
		t.Fatalf("new record got offset %d, not above %d", first, floor)
	}
}

// FuzzSegmentFlips flips bits anywhere in a real log (headers, frames,
// sealed and last segments) and can cut a sealed segment short. Input:
// byte 0 bit 0 says whether a consumer committed every record
// (AckedThrough), bit 1 whether the first 3 bytes after it are a cut; then
// each 3 bytes flip mask (byte 3) at a position (bytes 1-2) of the segment
// files laid end to end. A cut's position (bytes 1-2) is taken over the
// sealed segments laid end to end; its byte 3 bit 0 cuts at the frame
// boundary at or before it (the silent loss of session 7), else exactly
// there. Every record whose bytes were not touched must be read back intact
// at its offset; every other record must be read back intact or counted.
//
// Known limit (FORMAT.md): flips that turn the next segment's version 4
// into a valid version 2 header (an older repair's gap looked the same), or
// that forge the gap marker of a segment cut to its header, hide a cut at a
// frame boundary; records cut then are exempt.
func FuzzSegmentFlips(f *testing.F) {
	l, err := fuzzTemplate()
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		acked := uint64(0)
		if in[0]&1 == 1 {
			acked = l.n
		}
		files := map[string][]byte{}
		for name, b := range l.files {
			files[name] = append([]byte(nil), b...)
		}
		touched := map[string][]int{}
		start := 1
		if in[0]&2 != 0 {
			start = 4
		}
		for k := start; k+3 <= len(in) && k <= 1+3*16; k += 3 {
			pos := int(binary.LittleEndian.Uint16(in[k:])) % l.total
			mask := in[k+2]
			if mask == 0 {
				continue
			}
			for _, name := range l.names {
				if pos < len(files[name]) {
					files[name][pos] ^= mask
					touched[name] = append(touched[name], pos)
					break
				}
				pos -= len(files[name])
			}
		}
		// The cut, after the flips (their positions are over the whole
		// files): the cut-off bytes count as touched.
		cutFile, cutAt := "", 0
		if in[0]&2 != 0 && len(in) >= 4 {
			cutFile, cutAt = l.cut(int(binary.LittleEndian.Uint16(in[1:])), in[3]&1 == 1)
			files[cutFile] = files[cutFile][:cutAt]
			touched[cutFile] = append(touched[cutFile], cutAt)
			for _, sp := range l.spans {
				if sp.file == cutFile && sp.start >= cutAt {
					touched[cutFile] = append(touched[cutFile], sp.start)
				}
			}
		}
		// A record cut off may go unnoticed when flips also changed the
		// version or gap byte of the cut segment's header or of the next
		// one's (the known limit above).
		hidden := func(off uint64) bool {
			sp := l.spans[off]
			if sp.file != cutFile || sp.end <= cutAt {
				return false
			}
			next := l.names[sort.SearchStrings(l.names, cutFile)+1]
			for _, name := range []string{cutFile, next} {
				for _, p := range touched[name] {
					if p == 4 || p == 5 {
						return true
					}
				}
			}
			return false
		}
		m := newMemFS()
		for name, b := range files {
			m.put(filepath.Join(fuzzDir, name), b)
		}
		w, got := recoverAll(t, m, acked, l.total/minFrameV2+1)
		have := map[uint64]bool{}
		for _, e := range got {
			if e.Offset <= l.n && !bytes.Equal(e.Data, rec(int(e.Offset))) {
				w.Close()
				t.Fatalf("offset %d: read %q, not the record written", e.Offset, e.Data)
			}
			if e.Offset > l.n {
				w.Close()
				t.Fatalf("offset %d was never written", e.Offset)
			}
			have[e.Offset] = true
		}
		for off := uint64(1); off <= l.n; off++ {
			if have[off] {
				continue
			}
			sp := l.spans[off]
			intact := true
			for _, p := range touched[sp.file] {
				if p >= sp.start && p < sp.end {
					intact = false
				}
			}
			if !intact && hidden(off) {
				continue
			}
			if intact {
				w.Close()
				t.Fatalf("record %d was not touched (flips %v) but is not read back; lost %+v, repaired %+v",
					off, touched, w.Lost(), w.Repaired())
			}
			if !counted(w, off) {
				w.Close()
				t.Fatalf("record %d is damaged but not counted; lost %+v, repaired %+v", off, w.Lost(), w.Repaired())
			}
			if acked >= off && w.Repaired().Records > 0 && w.Repaired().TornFrom <= off && !inLoss(w, off) {
				w.Close()
				t.Fatalf("committed record %d counted as a torn write", off)
			}
		}
		repairIsFinal(t, m, w, got, acked)
	})
}

// cut returns where a cut at pos (over the sealed segments laid end to
// end) falls: the file and the length it keeps, at the frame boundary at or
// before pos when atFrame is set (the header at least).
func (l *fuzzLog) cut(pos int, atFrame bool) (string, int) {
	sealed := l.names[:len(l.names)-1]
	total := 0
	for _, name := range sealed {
		total += len(l.files[name])
	}
	pos %= total
	for _, name := range sealed {
		if pos >= len(l.files[name]) {
			pos -= len(l.files[name])
			continue
		}
		if !atFrame {
			return name, pos
		}
		at := min(pos, headerSize)
		for _, sp := range l.spans {
			if sp.file == name && sp.start <= pos && sp.start > at {
				at = sp.start
			}
		}
		return name, at
	}
	return sealed[0], 0 // not reached: pos < total
}

func inLoss(w *WAL, off uint64) bool {
	for _, l := range w.Lost() {
		if l.From <= off && off <= l.To {
			return true
		}
	}
	return false
}

// fuzzFrame is an intact version 2 frame found at some position of
// arbitrary bytes.
type fuzzFrame struct {
	pos  int
	f    frame
	data []byte
}

// FuzzSegmentBytes opens arbitrary bytes as a log's only segment
// (00000000000000000001.seg). Every record read must be an intact frame of
// the input; the intact frames before the first damage must all be read;
// and every intact frame that was not read, lies in order between the
// records read around it and fits in the bytes after the one before it
// (FORMAT.md: "Repair on open") must be counted as lost or torn.
func FuzzSegmentBytes(f *testing.F) {
	f.Add([]byte{})
	f.Add(encodeHeader(formatVersion, 1, false))
	f.Fuzz(func(t *testing.T, in []byte) {
		m := newMemFS()
		m.put(filepath.Join(fuzzDir, segmentName(1)), in)
		if len(in) > headerSize && in[4] == formatV1 {
			return // version 1 frames carry no offset: nothing to check them against
		}
		var frames []fuzzFrame
		for p := headerSize; p+minFrameV2 <= len(in); p++ {
			if fm, ok := parseFrame(in[p:], DefaultMaxRecordBytes); ok && fm.off >= 1 {
				frames = append(frames, fuzzFrame{p, fm, in[p+frameHeaderV2 : p+fm.size]})
			}
		}
		w, got := recoverAll(t, m, 0, len(in)/minFrameV2+1)
		// Match each record read to the first intact frame after the
		// previous match with the same offset and payload.
		matched := make([]int, len(got))
		k := 0
		for i, e := range got {
			for k < len(frames) && (frames[k].f.off != e.Offset || !bytes.Equal(frames[k].data, e.Data)) {
				k++
			}
			if k == len(frames) {
				w.Close()
				t.Fatalf("record %d (%q) is no intact frame of the input", e.Offset, e.Data)
			}
			matched[i] = k
			k++
		}
		// The intact prefix: frames back to back from the header on, with
		// increasing offsets.
		{
			pos, prev, i := headerSize, uint64(0), 0
			for _, fr := range frames {
				if fr.pos < pos {
					continue
				}
				if fr.pos > pos || fr.f.off <= prev {
					break
				}
				if i >= len(got) || got[i].Offset != fr.f.off {
					w.Close()
					t.Fatalf("intact frame %d at %d (before any damage) not read back", fr.f.off, fr.pos)
				}
				pos, prev, i = fr.pos+fr.f.size, fr.f.off, i+1
			}
		}
		// Frames not read that recovery could place.
		isMatched := map[int]bool{}
		for _, k := range matched {
			isMatched[k] = true
		}
		prevOff, prevEnd, next := uint64(0), headerSize, 0
		for k, fr := range frames {
			for next < len(matched) && matched[next] < k {
				mf := frames[matched[next]]
				prevOff, prevEnd = mf.f.off, mf.pos+mf.f.size
				next++
			}
			if isMatched[k] || fr.pos < prevEnd {
				continue
			}
			if fr.f.off <= prevOff || next < len(matched) && fr.f.off >= frames[matched[next]].f.off {
				continue // out of order: not a record of this segment
			}
			if fr.f.off > prevOff+1+uint64((fr.pos-prevEnd)/minFrameV2) {
				continue // does not fit after the record before it
			}
			if !counted(w, fr.f.off) {
				w.Close()
				t.Fatalf("intact frame %d at %d neither read nor counted; lost %+v, repaired %+v",
					fr.f.off, fr.pos, w.Lost(), w.Repaired())
			}
		}
		repairIsFinal(t, m, w, got, 0)
	})
}

// TestWriteFuzzSeeds writes the seed corpora of the fuzz targets from the
// template log (run with EVENTPIPE_WRITE_FUZZ_SEEDS=1 after a format
// change; the files are committed and run in plain go test).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("EVENTPIPE_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set EVENTPIPE_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	l, err := fuzzTemplate()
	if err != nil {
		t.Fatal(err)
	}
	write := func(target, name string, b []byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	// Flips: position (little-endian uint16 over the files laid end to
	// end) and mask, after the mode byte.
	at := func(file string, pos int) []byte {
		for _, name := range l.names {
			if name == file {
				break
			}
			pos += len(l.files[name])
		}
		return binary.LittleEndian.AppendUint16(nil, uint16(pos))
	}
	first, last := l.names[0], l.names[len(l.names)-1]
	mid := l.spans[l.n-3]
	cutAt := at // the sealed segments come first, so positions agree
	flips := []struct {
		name string
		in   []byte
	}{
		{"sealed-header-byte0", append(append([]byte{0}, at(l.names[1], 0)...), 1)},
		{"last-header-byte0", append(append([]byte{0}, at(last, 0)...), 1)},
		{"last-header-byte0-committed", append(append([]byte{1}, at(last, 0)...), 1)},
		{"first-header-version", append(append([]byte{0}, at(first, 4)...), 3)},
		{"last-record-payload", append(append([]byte{0}, at(mid.file, mid.end-2)...), 0x40)},
		{"last-record-payload-committed", append(append([]byte{1}, at(mid.file, mid.end-2)...), 0x40)},
		{"sealed-length-and-header", append(append(append(append([]byte{1}, at(first, 0)...), 0x80), at(first, headerSize+1)...), 0x10)},
		// Cuts: positions over the sealed segments only.
		{"sealed-cut-at-frame-boundary", append(append([]byte{2}, cutAt(first, l.spans[3].start+5)...), 1)},
		{"sealed-cut-at-frame-boundary-committed", append(append([]byte{3}, cutAt(l.names[1], 300)...), 1)},
		{"sealed-cut-to-header", append(append([]byte{2}, cutAt(l.names[1], headerSize)...), 1)},
		{"sealed-cut-mid-frame", append(append([]byte{2}, cutAt(first, l.spans[2].start+7)...), 0)},
		{"sealed-cut-and-next-header-damaged", append(append(append(append([]byte{2}, cutAt(first, l.spans[2].start)...), 1), at(l.names[1], 0)...), 1)},
	}
	for _, s := range flips {
		write("FuzzSegmentFlips", s.name, s.in)
	}
	// Segment seeds are named by format version: the version 2 ones
	// written before version 4 stay as seeds of their own.
	v := fmt.Sprintf("v%d-", formatVersion)
	for i, name := range l.names {
		write("FuzzSegmentBytes", fmt.Sprintf("%ssegment-%d", v, i), l.files[name])
	}
	b := append([]byte(nil), l.files[first]...)
	b[0] ^= 1
	write("FuzzSegmentBytes", v+"segment-0-header-flipped", b)
	b = append([]byte(nil), l.files[first]...)
	b[headerSize+frameHeaderV2+3] ^= 0x20
	write("FuzzSegmentBytes", v+"segment-0-first-payload-flipped", b)
	b = encodeHeader(formatVersion, 1, true)
	write("FuzzSegmentBytes", v+"gap-segment-alone", b)
	write("FuzzSegmentBytes", v+"gap-flag-on-frames", append(b, l.files[first][headerSize:]...))
	names := append([]string(nil), l.names...)
	sort.Strings(names)
	t.Logf("wrote seeds for %d segments", len(names))
}

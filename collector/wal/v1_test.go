package wal

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
)

// writeV1Segment writes a format version 1 segment (8-byte frame header,
// no offsets) holding rec(first)..rec(first+n-1).
func writeV1Segment(t *testing.T, dir string, first uint64, n int) {
	t.Helper()
	var b []byte
	b = append(b, 'E', 'P', 'W', 'L', formatV1, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, first)
	for i := range n {
		r := rec(int(first) + i)
		var h [frameHeaderV1]byte
		binary.LittleEndian.PutUint32(h[0:4], uint32(len(r)))
		binary.LittleEndian.PutUint32(h[4:8], crc32.Update(crc32.Checksum(h[0:4], castagnol), castagnol, r))
		b = append(b, h[:]...)
		b = append(b, r...)
	}
	if err := os.WriteFile(filepath.Join(dir, segmentName(first)), b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// A log written by the previous format opens: its records are read at
// their offsets, sealed and active alike, and new records go to a version
// 2 segment after them.
func TestVersion1SegmentsAreRead(t *testing.T) {
	dir := t.TempDir()
	writeV1Segment(t, dir, 1, 100)
	writeV1Segment(t, dir, 101, 30)
	w := mustOpen(t, dir, Options{})
	if _, last := w.Bounds(); last != 130 {
		t.Fatalf("last = %d, want 130", last)
	}
	checkAll(t, w, 1, 130)
	appendN(t, w, 131, 20, 7)
	checkAll(t, w, 1, 150)
	segs := w.Segments()
	if len(segs) != 3 || segs[2].First != 131 {
		t.Fatalf("segments %+v: new records must go to a version 2 segment of their own", segs)
	}
	w.Close()
	w2 := mustOpen(t, dir, Options{})
	if r := w2.Repaired(); r.Bytes != 0 || len(r.Lost) != 0 {
		t.Fatalf("reopen repaired %+v", r)
	}
	checkAll(t, w2, 1, 150)
	for from := uint64(1); from <= 150; from += 17 {
		got, err := w2.Read(from, 2)
		if err != nil || len(got) == 0 || got[0].Offset != from {
			t.Fatalf("read from %d: %v %v", from, got, err)
		}
	}
}

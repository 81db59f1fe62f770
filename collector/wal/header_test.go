package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// segmentFiles reads the segment files of dir, by name.
func segmentFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	m, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, p := range m {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(p)] = b
	}
	return out
}

// Issue 21, defect 1: a flipped bit in a segment's 16-byte header lost the
// segment (sealed: unreadable; last: dropped as a torn tail, nothing
// counted). Every bit of the header, in a sealed and in the last segment,
// of both formats, and the two-bit flip that turns version 2 into 1: the
// damage is found, named as the header's, costs no record (the frames are
// read by their own offsets and checksums), is refused at open when found
// there unless accepted, and an accepted repair rewrites the header so the
// next open is clean.
func TestEveryDamagedHeaderBitIsFoundAndCostsNoRecord(t *testing.T) {
	v2 := t.TempDir()
	w := mustOpen(t, v2, Options{SegmentBytes: 512, NoSync: true})
	appendN(t, w, 1, 40, 4)
	w.Close()
	v1 := t.TempDir()
	writeV1Segment(t, v1, 1, 20)
	writeV1Segment(t, v1, 21, 20)

	type flip struct {
		at   int64
		mask byte
	}
	flips := []flip{{4, 0x03}} // version 2 <-> 1
	for at := range int64(headerSize) {
		for bit := range 8 {
			flips = append(flips, flip{at, 1 << bit})
		}
	}
	for _, tmpl := range []struct {
		name  string
		files map[string][]byte
	}{{"v2", segmentFiles(t, v2)}, {"v1", segmentFiles(t, v1)}} {
		var names []string
		for name := range tmpl.files {
			names = append(names, name)
		}
		sort.Strings(names)
		if len(names) < 2 {
			t.Fatalf("%s: want several segments, got %d", tmpl.name, len(names))
		}
		for _, which := range []string{"sealed", "last"} {
			seg := names[0]
			if which == "last" {
				seg = names[len(names)-1]
			}
			for _, f := range flips {
				t.Run(fmt.Sprintf("%s/%s/byte%d^%#x", tmpl.name, which, f.at, f.mask), func(t *testing.T) {
					m := newMemFS()
					for name, b := range tmpl.files {
						if name == seg {
							b = append([]byte(nil), b...)
							b[f.at] ^= f.mask
						}
						m.put(filepath.Join("/log", name), b)
					}
					checkHeaderDamage(t, m, seg, which == "last")
				})
			}
		}
	}
}

func checkHeaderDamage(t *testing.T, m *memFS, seg string, atOpen bool) {
	t.Helper()
	const dir = "/log"
	isHeaderLoss := func(l []Loss) bool {
		return len(l) == 1 && l[0].Segment == seg && l[0].To < l[0].From && l[0].Bytes == headerSize &&
			strings.Contains(l[0].Reason, "header")
	}
	if atOpen {
		_, err := Open(dir, Options{FS: m, NoSync: true})
		var dl *DataLossError
		if !errors.As(err, &dl) || !isHeaderLoss(dl.Lost) {
			t.Fatalf("open: %v, want a DataLossError for the header of %s", err, seg)
		}
	}
	w, err := Open(dir, Options{FS: m, NoSync: true, AcceptDataLoss: true})
	if err != nil {
		t.Fatalf("open accepting the loss: %v", err)
	}
	checkAll(t, w, 1, 40)
	if !isHeaderLoss(w.Lost()) {
		t.Fatalf("lost = %+v, want the header of %s", w.Lost(), seg)
	}
	if got := counterValue(w.m.lostBytes); got != headerSize {
		t.Fatalf("data_loss_bytes_total = %v", got)
	}
	if r := w.Repaired(); r.Records != 0 || r.Bytes != 0 {
		t.Fatalf("intact records repaired as a torn tail: %+v", r)
	}
	if err := w.RewriteDamaged(); err != nil {
		t.Fatal(err)
	}
	checkAll(t, w, 1, 40)
	w.Close()
	w2, err := Open(dir, Options{FS: m, NoSync: true})
	if err != nil {
		t.Fatalf("open after the accepted repair: %v", err)
	}
	defer w2.Close()
	checkAll(t, w2, 1, 40)
	if l := w2.Lost(); len(l) != 0 {
		t.Fatalf("after the repair: lost %+v", l)
	}
}

// A last segment no longer than its header whose header is damaged was cut
// short while being created (a header is fsynced before any frame is
// written): it never held a record and is dropped as before.
func TestDamagedHeaderOfAnEmptyLastSegmentIsACutCreation(t *testing.T) {
	dir := t.TempDir()
	w := mustOpen(t, dir, Options{NoSync: true})
	appendN(t, w, 1, 10, 10)
	w.Close()
	hdr := encodeHeader(formatVersion, 11, false)
	hdr[0] ^= 1
	if err := os.WriteFile(filepath.Join(dir, segmentName(11)), hdr, 0o640); err != nil {
		t.Fatal(err)
	}
	w2 := mustOpen(t, dir, Options{NoSync: true})
	if r := w2.Repaired(); r.Bytes != headerSize || len(r.Lost) != 0 {
		t.Fatalf("repair = %+v", r)
	}
	appendN(t, w2, 11, 3, 3)
	checkAll(t, w2, 1, 13)
}

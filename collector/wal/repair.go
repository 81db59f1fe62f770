package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ErrDataLoss is wrapped by the error Open returns when it finds
// acknowledged records damaged or missing and Options.AcceptDataLoss is
// false. The log is then left as it was found.
var ErrDataLoss = errors.New("acknowledged log data lost")

// Repair reports what Open found and repaired.
type Repair struct {
	// Segment, Records and Bytes describe the torn tail dropped: records of
	// the last write, which was never acknowledged (see FORMAT.md for why a
	// torn tail cannot hold an acknowledged record).
	Segment string
	Records int
	Bytes   int64
	// TornFrom is the lowest offset the torn write held (0: none): records
	// from there on were never acknowledged, and a checkpoint written in
	// parallel with that write must not be trusted.
	TornFrom uint64
	// Lost lists acknowledged data found damaged or missing.
	Lost []Loss
	// Through is set when Open made sure no offset up to it is ever handed
	// out again (0: nothing to skip).
	Through uint64
}

// LostRecords and LostBytes total r.Lost.
func (r Repair) LostRecords() uint64 { return lostRecords(r.Lost) }

// LostBytes totals the bytes of r.Lost.
func (r Repair) LostBytes() int64 {
	var n int64
	for _, l := range r.Lost {
		n += l.Bytes
	}
	return n
}

func lostRecords(ls []Loss) uint64 {
	var n uint64
	for _, l := range ls {
		if l.To >= l.From {
			n += l.To - l.From + 1
		}
	}
	return n
}

// Loss is one region of acknowledged data that is gone: the records with
// offsets From..To (none when To < From: damaged bytes between intact
// records) and the bytes they occupied.
type Loss struct {
	Segment  string
	From, To uint64
	Bytes    int64
	Reason   string
}

func (l Loss) String() string {
	if l.To < l.From {
		return fmt.Sprintf("%s: %d damaged bytes, no record lost (%s)", l.Segment, l.Bytes, l.Reason)
	}
	return fmt.Sprintf("%s: offsets %d..%d (%d records, %d bytes): %s", l.Segment, l.From, l.To, l.To-l.From+1, l.Bytes, l.Reason)
}

// DataLossError is returned by Open when it refuses to repair acknowledged
// data loss (Options.AcceptDataLoss false). It wraps ErrDataLoss.
type DataLossError struct {
	Dir  string
	Lost []Loss
}

func (e *DataLossError) Error() string {
	parts := make([]string, len(e.Lost))
	for i, l := range e.Lost {
		parts[i] = l.String()
	}
	return fmt.Sprintf("%v in %s: %d records: %s; nothing was modified", ErrDataLoss, e.Dir, lostRecords(e.Lost), strings.Join(parts, "; "))
}

func (e *DataLossError) Unwrap() error { return ErrDataLoss }

// damaged is a byte range of a segment that holds no intact frame.
type damaged struct {
	from, to       int64  // bytes [from, to)
	offFrom, offTo uint64 // offsets it held (offTo < offFrom: none)
}

// scan is what a full pass over one segment found.
type scan struct {
	frames         uint64
	lastOff        uint64 // offset of the last intact frame (first-1 if none)
	end            int64  // end of the last intact frame
	index          []indexEntry
	damage         []damaged // between intact frames, in file order
	tail           *damaged  // damage running to the end of the file
	lastRoundStart int64     // position of the last intact round-start frame, -1 if none
	// Set by scanFile: the format version the frames were read with, the
	// segment's first offset and, when the header was damaged, its bytes.
	ver    byte
	first  uint64
	header *damaged
	// gap: an intact header marks a gap segment (and no frame follows it).
	gap bool
}

// damaged reports whether the scan found anything to repair.
func (sc scan) damaged() bool { return len(sc.damage) > 0 || sc.tail != nil || sc.header != nil }

// scanFile checks the header of a segment of size bytes starting at first
// and scans its frames with the version found (see headerVersion). A
// damaged header does not end the scan: the frames carry their own offsets
// and checksums.
func scanFile(f File, first uint64, size int64, maxRec int) (scan, error) {
	ver, gap, bad, err := headerVersion(f, first, size, maxRec)
	if err != nil {
		return scan{}, fmt.Errorf("read header: %w", err)
	}
	sc, err := scanSegment(f, ver, first, size, maxRec)
	sc.ver, sc.first = ver, first
	if gap && sc.frames > 0 {
		// A gap segment holds no frame: the flag contradicts the frames,
		// as a wrong version would.
		gap, bad = false, true
	}
	sc.gap = gap
	if bad {
		sc.header = &damaged{from: 0, to: min(size, headerSize), offFrom: first, offTo: first - 1}
	}
	return sc, err
}

// headerVersion returns the format version to read a segment's frames with,
// whether the header marks a gap segment, and whether it is damaged. The
// header holds nothing that is not known elsewhere: the magic and the zero
// bytes are constants, the first offset is the file name, the version must
// agree with the first frame, whose checksum settles it, and the gap flag
// with the absence of frames (scanFile). So every header byte is checked,
// and when the header is damaged the first frame names the frame layout
// (version 2 frames, which can be resynchronised, when the first frame is
// damaged too; they are rewritten under a version 4 header).
func headerVersion(f File, first uint64, size int64, maxRec int) (ver byte, gap, bad bool, err error) {
	var hdr [headerSize]byte
	n, err := f.ReadAt(hdr[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, false, false, err
	}
	hv, gap, ok := parseHeader(hdr, first)
	ok = ok && n == headerSize
	fv, err := firstFrameVersion(f, first, size, maxRec)
	if err != nil {
		return 0, false, false, err
	}
	switch {
	case ok && (fv == 0 || fv == frameVersion(hv)):
		return hv, gap, false, nil
	case fv == formatV1:
		return formatV1, false, true, nil
	default:
		return formatVersion, false, true, nil
	}
}

// firstFrameVersion returns the version (formatV2 or formatV1) as which the
// frame right after the header is intact, or 0 when it is intact as
// neither.
func firstFrameVersion(f File, first uint64, size int64, maxRec int) (byte, error) {
	var h [frameHeaderV2]byte
	n, err := f.ReadAt(h[:], headerSize)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	if n < frameHeaderV1 {
		return 0, nil
	}
	word := binary.LittleEndian.Uint32(h[0:4])
	read := func(from, l int64) ([]byte, error) {
		b := make([]byte, l)
		if _, err := f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return b, nil
	}
	if l := int64(word & lengthMask); n == frameHeaderV2 && l > 0 && l <= int64(maxRec) && headerSize+frameHeaderV2+l <= size {
		b, err := read(headerSize, frameHeaderV2+l)
		if err != nil {
			return 0, err
		}
		if fm, ok := parseFrame(b, maxRec); ok && fm.off >= first {
			return formatV2, nil
		}
	}
	if l := int64(word); l > 0 && l <= int64(maxRec) && headerSize+frameHeaderV1+l <= size {
		b, err := read(headerSize+frameHeaderV1, l)
		if err != nil {
			return 0, err
		}
		if crc32.Update(crc32.Checksum(h[0:4], castagnol), castagnol, b) == binary.LittleEndian.Uint32(h[4:8]) {
			return formatV1, nil
		}
	}
	return 0, nil
}

// headerLoss is the loss a damaged header stands for: no record, since the
// frames are read by their own offsets and checksums, but fsynced bytes
// the disk altered (a header is fsynced before any frame is written).
func headerLoss(segment string, h damaged) Loss {
	return Loss{Segment: segment, From: h.offFrom, To: h.offTo, Bytes: h.to - h.from,
		Reason: "segment header damaged (fsynced before any frame: the disk altered it); " +
			"the frames were read by their own offsets and checksums and the header is rewritten when the loss is accepted"}
}

// scanSegment reads every frame of a segment of size bytes. Version 2
// segments are resynchronised after damage: the scan looks for the next
// intact frame (length, checksum, and an offset that fits) and carries on,
// so one bad record costs that record only. Version 1 frames carry no
// offset: the first damage ends the scan there.
func scanSegment(f File, ver byte, first uint64, size int64, maxRec int) (scan, error) {
	sc := scan{lastOff: first - 1, end: headerSize, lastRoundStart: -1}
	fr := newFrameReader(f, ver, headerSize, size, first, maxRec, 1<<20)
	var buf []byte
	for {
		pos := fr.pos
		fm, err := fr.read(&buf)
		if errors.Is(err, io.EOF) {
			return sc, nil
		}
		if err == nil && (ver == formatV1 || fm.off > sc.lastOff) {
			if sc.frames%indexStride == 0 {
				sc.index = append(sc.index, indexEntry{off: fm.off, pos: pos})
			}
			sc.frames++
			sc.lastOff = fm.off
			sc.end = pos + int64(fm.size)
			if fm.roundStart {
				sc.lastRoundStart = pos
			}
			continue
		}
		rest := make([]byte, size-pos)
		if _, err := f.ReadAt(rest, pos); err != nil && !errors.Is(err, io.EOF) {
			return sc, fmt.Errorf("read damaged region: %w", err)
		}
		if ver != formatV1 {
			if q, nf, ok := resync(rest, sc.lastOff, maxRec); ok {
				sc.damage = append(sc.damage, damaged{from: pos, to: pos + int64(q), offFrom: sc.lastOff + 1, offTo: nf.off - 1})
				fr.seek(pos + int64(q))
				continue
			}
		}
		sc.tail = &damaged{from: pos, to: size, offFrom: sc.lastOff + 1, offTo: tailOffsets(rest, ver, sc.lastOff, maxRec)}
		return sc, nil
	}
}

// resync finds, in b (which starts with damage), the first position q > 0
// where an intact v2 frame starts whose offset follows prev and fits in the
// damaged bytes before it (at most one frame per minFrameV2 bytes).
func resync(b []byte, prev uint64, maxRec int) (int, frame, bool) {
	for q := 1; q+minFrameV2 <= len(b); q++ {
		word := binary.LittleEndian.Uint32(b[q : q+4])
		l := int(word & lengthMask)
		if l == 0 || l > maxRec || q+frameHeaderV2+l > len(b) {
			continue
		}
		off := binary.LittleEndian.Uint64(b[q+8 : q+16])
		if off <= prev || off > prev+1+uint64(q/minFrameV2) {
			continue
		}
		if fm, ok := parseFrame(b[q:], maxRec); ok {
			return q, fm, true
		}
	}
	return 0, frame{}, false
}

// tailOffsets estimates the last offset a damaged tail held: it follows
// length prefixes and takes the highest plausible offset seen (v2), or
// counts the frames (v1). A non-empty tail held at least prev+1.
func tailOffsets(b []byte, ver byte, prev uint64, maxRec int) uint64 {
	hi := prev + 1
	hs := frameHeaderSize(ver)
	n := uint64(0)
	for p := 0; p+hs <= len(b); {
		word := binary.LittleEndian.Uint32(b[p : p+4])
		l := word
		if ver != formatV1 {
			l &= lengthMask
			off := binary.LittleEndian.Uint64(b[p+8 : p+16])
			if off > prev && off <= prev+1+uint64(len(b)/minFrameV2) {
				hi = max(hi, off)
			}
		}
		n++
		if l == 0 || int64(l) > int64(maxRec) {
			break
		}
		p += hs + int(l)
	}
	if ver == formatV1 {
		hi = prev + max(n, 1)
	}
	return hi
}

// rewriteSegment replaces the file at path by its header and the intact
// frames of sc (every damaged range and the damaged tail left out), via a
// temporary file, fsync, rename and a directory fsync.
func (w *WAL) rewriteSegment(f File, path string, sc scan) error {
	tmp := path + ".repair"
	out, err := w.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("create repaired segment: %w", err)
	}
	copyRange := func(from, to int64) error {
		buf := make([]byte, min(to-from, 1<<20))
		for from < to {
			n := min(int64(len(buf)), to-from)
			if _, err := f.ReadAt(buf[:n], from); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if err := writeFull(out, buf[:n]); err != nil {
				return err
			}
			from += n
		}
		return nil
	}
	// A fresh header (the scan checked every byte of the old one against
	// what it must hold), then the intact frames.
	err = writeFull(out, encodeHeader(sc.ver, sc.first, sc.gap))
	pos := int64(headerSize)
	for _, d := range sc.damage {
		if err != nil {
			break
		}
		err = copyRange(pos, d.from)
		pos = d.to
	}
	if err == nil {
		err = copyRange(pos, sc.end)
	}
	if err == nil && !w.opts.NoSync {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = w.fs.Rename(tmp, path)
	}
	if err == nil {
		err = w.fs.SyncDir(w.dir)
	}
	if err != nil {
		_ = w.fs.Remove(tmp)
		return fmt.Errorf("rewrite damaged segment %s: %w", filepath.Base(path), err)
	}
	return nil
}

// recordLoss counts, logs and remembers acknowledged data found lost.
func (w *WAL) recordLoss(lost []Loss, accepted bool) {
	if len(lost) == 0 {
		return
	}
	w.lossMu.Lock()
	w.lost = append(w.lost, lost...)
	w.lossMu.Unlock()
	for _, l := range lost {
		n := uint64(0)
		if l.To >= l.From {
			n = l.To - l.From + 1
		}
		w.m.lostRecords.Add(float64(n))
		w.m.lostBytes.Add(float64(l.Bytes))
		w.log.Error("LOG DATA LOSS: acknowledged records are damaged or missing", "segment", l.Segment,
			"from_offset", l.From, "to_offset", l.To, "records", n, "bytes", l.Bytes, "reason", l.Reason,
			"accepted", accepted)
	}
}

// Lost returns every loss of acknowledged data found since Open (at Open,
// and later when a sealed segment was first read).
func (w *WAL) Lost() []Loss {
	w.lossMu.Lock()
	defer w.lossMu.Unlock()
	return append([]Loss(nil), w.lost...)
}

// RewriteDamaged rewrites every sealed segment in which damage was found
// (readers step over it in memory) without the damaged bytes, and records
// the missing tail of a sealed segment found short as a gap segment, so
// that the next Open does not find, count and refuse the same loss again.
// The store calls it at open when the operator accepted data loss. It
// blocks readers while it runs.
func (w *WAL) RewriteDamaged() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	sealed := append([]*segment(nil), w.segs[:len(w.segs)-1]...)
	for _, s := range sealed {
		s.mu.Lock()
		err := w.rewriteSealedLocked(s)
		if err == nil && s.short {
			err = w.addGap(s, s.first+s.dcount-1)
			if err == nil {
				w.log.Warn("wal: the missing tail of a sealed segment is recorded as a gap (the loss was accepted)",
					"segment", filepath.Base(s.path))
			}
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	w.updateGaugesLocked()
	return nil
}

// rewriteSealedLocked rewrites s when its scan found damage. Callers hold
// w.mu and s.mu.
func (w *WAL) rewriteSealedLocked(s *segment) error {
	if !s.indexed || (len(s.skips) == 0 && !s.badHeader) || s.rf == nil {
		return nil
	}
	name := filepath.Base(s.path)
	sc, err := scanFile(s.rf, s.first, s.dsize, w.opts.MaxRecordBytes)
	if err != nil {
		return fmt.Errorf("segment %s: %w", name, err)
	}
	if err := w.rewriteSegment(s.rf, s.path, sc); err != nil {
		return err
	}
	s.rf.Close()
	s.rf = nil
	f, err := w.fs.OpenFile(s.path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open rewritten segment %s: %w", name, err)
	}
	s.rf = f
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat rewritten segment %s: %w", name, err)
	}
	s.size, s.dsize = st.Size(), st.Size()
	sc, err = scanFile(f, s.first, s.dsize, w.opts.MaxRecordBytes)
	if err == nil && sc.damaged() {
		err = errors.New("still damaged after the rewrite")
	}
	if err != nil {
		return fmt.Errorf("rescan rewritten segment %s: %w", name, err)
	}
	s.index, s.skips, s.lastFrame, s.frames, s.badHeader = sc.index, nil, sc.lastOff, sc.frames, false
	// A damaged end was dropped: the segment now ends before the next one
	// starts, which the next open would take for a lost tail. RewriteDamaged
	// records the accepted loss as a gap segment.
	s.short = s.short || s.endsAtNext && !sc.gap && sc.lastOff < s.first+s.dcount-1
	w.log.Warn("wal: damaged sealed segment rewritten without its damaged bytes (the loss was accepted)", "segment", name)
	return nil
}

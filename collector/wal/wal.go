package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// DefaultSegmentBytes is the size at which a new segment is started.
	DefaultSegmentBytes int64 = 64 << 20
	// DefaultMaxRecordBytes bounds one record; a longer length prefix is
	// treated as corruption.
	DefaultMaxRecordBytes = 16 << 20

	segmentSuffix = ".seg"
	// indexStride: one file position is remembered every indexStride
	// records, so a read seeks to within indexStride frames of its offset.
	indexStride = 64
)

var (
	// ErrNotWritable is wrapped by every append refused after a failed
	// write or fsync. It is retryable: close and reopen the WAL to repair.
	ErrNotWritable = errors.New("wal not writable")
	// ErrClosed is returned by calls on a closed WAL.
	ErrClosed = errors.New("wal closed")
	// ErrCorrupt is wrapped by read errors on a record that fails its
	// checksum or framing outside the repaired tail.
	ErrCorrupt = errors.New("wal record corrupt")

	magic     = [4]byte{'E', 'P', 'W', 'L'}
	castagnol = crc32.MakeTable(crc32.Castagnoli)
)

// Options are set by code, not by users (the store maps its Config here).
type Options struct {
	// SegmentBytes: start a new segment when a batch would grow the active
	// one past this (default DefaultSegmentBytes).
	SegmentBytes int64
	// MaxRecordBytes bounds one record (default DefaultMaxRecordBytes).
	MaxRecordBytes int
	// FS is the file system (default OSFS).
	FS FS
	// Logger (nil: discard) and Registerer (nil: no metrics).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// NoSync skips fsync (tests and benchmarks only): records become
	// visible at Sync without being durable against power loss.
	NoSync bool
	// Metrics, when set, are used instead of registering new ones with
	// Registerer (see NewMetrics).
	Metrics *Metrics
	// Now is the clock used for segment ages (default time.Now).
	Now func() time.Time
	// AckedThrough is evidence from the caller that every offset up to it
	// was acknowledged (a consumer committed it). Open treats a tail record
	// it must drop at or below it, or a log that ends before it, as lost
	// acknowledged data, and never hands out an offset up to it again.
	AckedThrough uint64
	// AcceptDataLoss lets Open repair a log in which acknowledged data is
	// damaged or missing (counted and logged at ERROR). When false, Open
	// refuses such a log with a *DataLossError and leaves it untouched.
	AcceptDataLoss bool
}

// Entry is one record read back.
type Entry struct {
	Offset uint64
	Data   []byte
}

// SegmentInfo describes one segment file.
type SegmentInfo struct {
	Name        string
	First, Last uint64 // Last < First when the segment is empty
	Bytes       int64
	ModTime     time.Time
	// Gap: a gap segment. Its offsets held no record (their loss was
	// counted when the repair skipped them), so removing it removes none.
	Gap bool
}

type segment struct {
	first   uint64
	version byte
	count   uint64 // offsets spanned (records and holes): the last is first+count-1
	size    int64  // bytes written, header included
	dsize   int64  // bytes durable (fsynced)
	dcount  uint64 // offsets spanned by durable frames
	frames  uint64 // frames in the segment (for the index stride)
	last    uint64 // offset of the last frame written, first-1 if none (the active segment's)
	modTime time.Time
	path    string

	mu      sync.Mutex // guards rf, index, skips, lastFrame, indexed, badHeader
	rf      File       // read handle, opened lazily
	index   []indexEntry
	skips   []damaged // damaged byte ranges readers jump over
	indexed bool
	// badHeader: the scan found the header damaged (RewriteDamaged
	// writes it again).
	badHeader bool
	// endsAtNext: the next segment was written by a version that keeps
	// the segment before it dense to its end (format version 4; also when
	// its header is damaged, so that nothing goes unsaid), so a sealed
	// segment whose last frame is before the next segment's first offset
	// lost its tail. Not set before a version 1 or 2 segment: an older
	// repair left its gap at the end of the repaired segment.
	endsAtNext bool
	// gap: a gap segment (no frame; its offsets were skipped by a repair).
	gap bool
	// short: the scan found the segment's tail missing (RewriteDamaged
	// records the accepted loss as a gap segment).
	short bool
	// lastFrame is the offset of the last intact frame (first-1: none),
	// known once indexed.
	lastFrame uint64
}

// indexEntry: the frame at file position pos has offset off. One frame in
// indexStride is indexed.
type indexEntry struct {
	off uint64
	pos int64
}

// WAL is an append-only log of opaque records. Safe for concurrent use.
type WAL struct {
	dir  string
	opts Options
	fs   FS
	log  *slog.Logger
	m    *Metrics

	// writeMu serialises writers (Write, Sync, roll). Held across I/O.
	writeMu sync.Mutex
	active  File // write handle of the last segment
	failed  error
	// synced: nothing was written to the active segment since its last
	// fsync; the next frame written is flagged as a round start.
	synced bool

	// mu guards the segment list and the durable boundary. Readers hold it
	// shared while they read; writers take it exclusively only to publish.
	mu   sync.RWMutex
	segs []*segment
	// removedGaps: the offset ranges of gap segments retention removed
	// since the WAL was opened (the newest maxRemovedGaps), so ReadSkip
	// does not report their offsets as records removed: they never held
	// one. Not kept across a restart: a reader that far behind may then
	// count them once more (never fewer).
	removedGaps []offRange
	durable     uint64 // last durable offset (skipped offsets included)
	lastRec     uint64 // offset of the newest durable record
	closed      bool

	lossMu sync.Mutex
	lost   []Loss

	// group commit for Append.
	gmu      sync.Mutex
	queue    []*request
	flushing bool

	repair Repair
}

type request struct {
	recs  [][]byte
	first uint64
	err   error
	wake  chan bool // false: done; true: you lead the next round
}

// Open opens (creating if needed) the WAL in dir, verifies its last segment
// and repairs it (see FORMAT.md, "Repair on open").
func Open(dir string, opts Options) (*WAL, error) {
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = DefaultSegmentBytes
	}
	if opts.MaxRecordBytes <= 0 {
		opts.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if opts.FS == nil {
		opts.FS = OSFS{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	w := &WAL{dir: dir, opts: opts, fs: opts.FS, log: opts.Logger}
	w.m = opts.Metrics
	if w.m == nil {
		m, err := NewMetrics(opts.Registerer)
		if err != nil {
			return nil, err
		}
		w.m = m
	}
	if err := w.fs.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create wal dir: %w", err)
	}
	if err := w.load(); err != nil {
		w.closeFiles()
		return nil, err
	}
	if w.repair.Bytes > 0 {
		w.log.Warn("wal tail repaired: dropped the torn, unacknowledged tail of the last write",
			"segment", w.repair.Segment, "records", w.repair.Records, "bytes", w.repair.Bytes)
		w.m.repairedRecords.Add(float64(w.repair.Records))
		w.m.repairedBytes.Add(float64(w.repair.Bytes))
	}
	if w.repair.Through > 0 {
		w.log.Warn("wal: offsets of dropped records are never handed out again", "next_offset", w.repair.Through+1)
	}
	w.updateGauges()
	return w, nil
}

func segmentName(first uint64) string { return fmt.Sprintf("%020d%s", first, segmentSuffix) }

func (w *WAL) load() error {
	entries, err := w.fs.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("list wal dir: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, segmentSuffix+".repair") {
			// A rewrite interrupted before its rename: the original is intact.
			if err := w.fs.Remove(filepath.Join(w.dir, name)); err != nil {
				return fmt.Errorf("remove interrupted repair: %w", err)
			}
			continue
		}
		if e.IsDir() || !strings.HasSuffix(name, segmentSuffix) {
			continue
		}
		first, err := strconv.ParseUint(strings.TrimSuffix(name, segmentSuffix), 10, 64)
		if err != nil || first == 0 || name != segmentName(first) {
			w.log.Warn("wal: ignoring a file that is not a segment", "file", name)
			continue
		}
		info, err := e.Info()
		if err != nil {
			return fmt.Errorf("stat segment %s: %w", name, err)
		}
		w.segs = append(w.segs, &segment{first: first, size: info.Size(), dsize: info.Size(),
			modTime: info.ModTime(), path: filepath.Join(w.dir, name)})
	}
	sort.Slice(w.segs, func(i, j int) bool { return w.segs[i].first < w.segs[j].first })
	for i := 0; i+1 < len(w.segs); i++ {
		s := w.segs[i]
		s.count = w.segs[i+1].first - s.first
		s.dcount = s.count
		end, err := w.endsAtNext(w.segs[i+1])
		if err != nil {
			return err
		}
		s.endsAtNext = end
	}
	var sc scan
	for {
		if len(w.segs) == 0 {
			return w.createSegment(1)
		}
		last := w.segs[len(w.segs)-1]
		ok, err := w.scanLast(last, &sc)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		// Empty or headerless last segment: drop it and recreate or fall
		// back to its predecessor.
		w.repair.Segment = filepath.Base(last.path)
		w.repair.Bytes += last.size
		if err := w.fs.Remove(last.path); err != nil {
			return fmt.Errorf("remove empty segment: %w", err)
		}
		w.segs = w.segs[:len(w.segs)-1]
		if len(w.segs) == 0 {
			if err := w.createSegment(last.first); err != nil {
				return err
			}
			break
		}
	}
	return w.repairLast(sc)
}

// endsAtNext reports whether the segment before next must end right before
// next's first offset: next's header is version 4, or damaged (then
// checking is the side that cannot hide a loss).
func (w *WAL) endsAtNext(next *segment) (bool, error) {
	f, err := w.fs.OpenFile(next.path, os.O_RDONLY, 0)
	if err != nil {
		return false, fmt.Errorf("open segment %s: %w", filepath.Base(next.path), err)
	}
	defer f.Close()
	var hdr [headerSize]byte
	n, err := f.ReadAt(hdr[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read header of %s: %w", filepath.Base(next.path), err)
	}
	ver, _, ok := parseHeader(hdr, next.first)
	return !ok || n < headerSize || ver == formatV4, nil
}

// scanLast checks the header and scans every frame of the last segment. It
// returns false when the segment is no longer than its header and the
// header is damaged or short (a creation cut short: drop the file).
func (w *WAL) scanLast(s *segment, sc *scan) (bool, error) {
	f, err := w.fs.OpenFile(s.path, os.O_RDONLY, 0)
	if err != nil {
		return false, fmt.Errorf("open last segment: %w", err)
	}
	defer f.Close()
	*sc, err = scanFile(f, s.first, s.size, w.opts.MaxRecordBytes)
	if err != nil {
		return false, fmt.Errorf("scan segment %s: %w", filepath.Base(s.path), err)
	}
	if sc.header != nil && s.size <= headerSize || sc.gap {
		// Nothing after a damaged or short header: the segment's creation
		// was cut short (its header is fsynced before any frame is
		// written), so it never held a record. A gap segment is never the
		// last one: the segment after it was not created (its end, the
		// next segment's first offset, is unknown), so the segment before
		// it is the active one again.
		*sc = scan{}
		return false, nil
	}
	s.version = sc.ver
	return true, nil
}

// repairLast decides what the scan of the last segment means, refuses or
// repairs it, opens it for appends and makes sure that no offset up to the
// highest one the log may have handed out is handed out again.
func (w *WAL) repairLast(sc scan) error {
	s := w.segs[len(w.segs)-1]
	name := filepath.Base(s.path)
	acked := w.opts.AckedThrough
	var lost []Loss
	var tornRecords, tornFrom uint64
	var tornBytes int64
	torn := func(from uint64) {
		if tornFrom == 0 || from < tornFrom {
			tornFrom = from
		}
	}
	if h := sc.header; h != nil {
		lost = append(lost, headerLoss(name, *h))
	}
	for _, d := range sc.damage {
		// A later round-start frame proves the damaged bytes were fsynced
		// before it was written: they held acknowledged data.
		switch {
		case sc.lastRoundStart >= d.to:
			lost = append(lost, Loss{Segment: name, From: d.offFrom, To: d.offTo, Bytes: d.to - d.from,
				Reason: "damaged record(s) followed by later writes (the disk lost or altered fsynced data)"})
		case d.offTo >= d.offFrom && d.offFrom <= acked:
			lost = append(lost, Loss{Segment: name, From: d.offFrom, To: d.offTo, Bytes: d.to - d.from,
				Reason: fmt.Sprintf("damaged record(s) a consumer already committed (cursor %d)", acked)})
		default: // inside the last, unacknowledged write
			tornRecords += d.offTo + 1 - d.offFrom
			tornBytes += d.to - d.from
			torn(d.offFrom)
		}
	}
	highest := sc.lastOff
	if t := sc.tail; t != nil {
		highest = max(highest, t.offTo)
		if t.offFrom <= acked {
			lost = append(lost, Loss{Segment: name, From: t.offFrom, To: min(t.offTo, max(acked, t.offFrom)), Bytes: t.to - t.from,
				Reason: fmt.Sprintf("torn tail holding record(s) a consumer already committed (cursor %d): the disk lost fsynced data", acked)})
			if t.offTo > acked {
				tornRecords += t.offTo - acked
				torn(acked + 1)
			}
		} else {
			tornRecords += t.offTo + 1 - t.offFrom
			tornBytes += t.to - t.from
			torn(t.offFrom)
		}
	}
	if acked > highest {
		lost = append(lost, Loss{Segment: name, From: highest + 1, To: acked,
			Reason: fmt.Sprintf("the log ends at offset %d but a consumer committed cursor %d: records are missing at the end (the disk lost fsynced data, or the log belongs to another collector)", highest, acked)})
		highest = acked
	}
	if len(lost) > 0 && !w.opts.AcceptDataLoss {
		return &DataLossError{Dir: w.dir, Lost: lost}
	}

	if len(sc.damage) > 0 || sc.tail != nil || sc.header != nil {
		f, err := w.fs.OpenFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open last segment for repair: %w", err)
		}
		if len(sc.damage) > 0 || sc.header != nil {
			err = w.rewriteSegment(f, s.path, sc)
		} else {
			err = f.Truncate(sc.end)
			if err == nil {
				err = f.Sync()
			}
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("repair segment %s: %w", name, err)
		}
		if tornBytes > 0 || tornRecords > 0 {
			w.repair.Segment = name
			w.repair.Records += int(tornRecords)
			w.repair.Bytes += tornBytes
			w.repair.TornFrom = tornFrom
		}
		// Positions moved: scan the repaired file again for the index.
		rf, err := w.fs.OpenFile(s.path, os.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("open repaired segment: %w", err)
		}
		st, err := rf.Stat()
		if err == nil {
			s.size = st.Size()
			sc, err = scanFile(rf, s.first, s.size, w.opts.MaxRecordBytes)
		}
		rf.Close()
		if err == nil && sc.damaged() {
			err = fmt.Errorf("still damaged after the repair")
		}
		if err != nil {
			return fmt.Errorf("rescan repaired segment %s: %w", name, err)
		}
	} else if !w.opts.NoSync {
		// Whatever is readable now may only sit in the page cache (a write
		// whose fsync failed before a restart of this process): make it
		// durable before anything builds on it.
		f, err := w.fs.OpenFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open last segment: %w", err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync last segment: %w", err)
		}
	}
	w.recordLoss(lost, true)
	w.repair.Lost = lost
	s.dsize = s.size
	s.count = sc.lastOff + 1 - s.first
	s.dcount, s.last = s.count, sc.lastOff
	s.index, s.indexed, s.lastFrame, s.frames = sc.index, true, sc.lastOff, sc.frames

	f, err := w.fs.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open active segment: %w", err)
	}
	w.active = f
	w.synced = true
	if plantReuseOffsets {
		highest = sc.lastOff
	}
	switch {
	case highest > sc.lastOff:
		// Offsets up to highest may have been seen (or were burned by the
		// torn write): start a new segment after them. The skipped offsets
		// are a gap segment of their own, so the repaired segment stays
		// dense to its end, as every sealed segment must.
		w.repair.Through = highest
		if err := w.addGap(s, highest); err != nil {
			return err
		}
		if err := w.createSegment(highest + 1); err != nil {
			return err
		}
	case s.version == formatV1:
		// New frames are version 2: they go to a segment of their own.
		if sc.frames == 0 {
			w.active.Close()
			w.active = nil
			if err := w.fs.Remove(s.path); err != nil {
				return fmt.Errorf("remove empty v1 segment: %w", err)
			}
			w.segs = w.segs[:len(w.segs)-1]
		}
		if err := w.createSegment(s.first + s.count); err != nil {
			return err
		}
	}
	last := w.segs[len(w.segs)-1]
	w.durable = last.first + last.count - 1
	return w.findLastRecord()
}

// addGap records durably that the offsets after the last frame of s (the
// last segment, or a sealed segment found short whose loss was accepted) up
// to through hold no record on purpose: a gap segment starting after that
// frame, holding only a header flagged as a gap; s itself becomes one when
// it holds no frame. Its end is the first offset of the segment after it,
// which the caller creates (or which exists). Callers hold writeMu (or are
// in Open) or w.mu.
func (w *WAL) addGap(s *segment, through uint64) error {
	first := s.lastFrame + 1
	if s.lastFrame < s.first {
		first = s.first
	}
	path := filepath.Join(w.dir, segmentName(first))
	// rewriteSegment with no frame writes the header to a temporary file
	// and renames it over path: a crash leaves either the old file or the
	// whole gap segment.
	if err := w.rewriteSegment(nil, path, scan{ver: formatVersion, first: first, gap: true, end: headerSize}); err != nil {
		return err
	}
	if first == s.first {
		s.version, s.gap, s.size, s.dsize, s.frames, s.index = formatVersion, true, headerSize, headerSize, 0, nil
		s.count, s.dcount, s.skips, s.short = through+1-s.first, through+1-s.first, nil, false
		if s.rf != nil {
			s.rf.Close()
			s.rf = nil
		}
		return nil
	}
	g := &segment{first: first, version: formatVersion, gap: true, size: headerSize, dsize: headerSize,
		count: through + 1 - first, dcount: through + 1 - first, modTime: s.modTime, path: path,
		indexed: true, last: first - 1, lastFrame: first - 1, endsAtNext: true}
	s.count, s.dcount, s.short, s.endsAtNext = first-s.first, first-s.first, false, true
	for i, x := range w.segs {
		if x == s {
			w.segs = append(w.segs[:i+1], append([]*segment{g}, w.segs[i+1:]...)...)
			break
		}
	}
	return nil
}

// findLastRecord sets lastRec: the last frame of the newest segment that
// has one (sealed segments are indexed as needed).
func (w *WAL) findLastRecord() error {
	for i := len(w.segs) - 1; i >= 0; i-- {
		s := w.segs[i]
		s.mu.Lock()
		err := w.ensureIndexedLocked(s)
		lf := s.lastFrame
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if lf >= s.first {
			w.lastRec = lf
			break
		}
		w.lastRec = s.first - 1
	}
	if !w.opts.AcceptDataLoss {
		if lost := w.Lost(); len(lost) > 0 {
			return &DataLossError{Dir: w.dir, Lost: lost}
		}
	}
	return nil
}

// parseHeader returns the segment's format version, whether it is a gap
// segment and whether every byte of the header holds an expected value (see
// headerVersion).
func parseHeader(hdr [headerSize]byte, first uint64) (ver byte, gap, ok bool) {
	ver, flags := hdr[4], hdr[5]
	ok = [4]byte(hdr[0:4]) == magic && (ver == formatV1 || ver == formatV2 || ver == formatV4) &&
		(flags == 0 || ver == formatV4 && flags == flagGap) &&
		hdr[6]|hdr[7] == 0 && binary.LittleEndian.Uint64(hdr[8:16]) == first
	return ver, flags == flagGap, ok
}

// encodeHeader returns the header of a segment of format version ver
// starting at first (a gap segment when gap is set).
func encodeHeader(ver byte, first uint64, gap bool) []byte {
	var hdr [headerSize]byte
	copy(hdr[0:4], magic[:])
	hdr[4] = ver
	if gap {
		hdr[5] = flagGap
	}
	binary.LittleEndian.PutUint64(hdr[8:16], first)
	return hdr[:]
}

// createSegment creates and syncs an empty segment starting at first and
// appends it to the list (callers hold writeMu, or are in Open).
func (w *WAL) createSegment(first uint64) error {
	path := filepath.Join(w.dir, segmentName(first))
	f, err := w.fs.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	if err := writeFull(f, encodeHeader(formatVersion, first, false)); err != nil {
		f.Close()
		return fmt.Errorf("write segment header: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync segment header: %w", err)
	}
	if err := w.fs.SyncDir(w.dir); err != nil {
		f.Close()
		return fmt.Errorf("sync wal dir: %w", err)
	}
	s := &segment{first: first, version: formatVersion, size: headerSize, dsize: headerSize, modTime: w.opts.Now(),
		path: path, indexed: true, last: first - 1, lastFrame: first - 1}
	w.mu.Lock()
	w.segs = append(w.segs, s)
	w.mu.Unlock()
	if w.active != nil {
		w.active.Close()
	}
	w.active = f
	w.synced = true
	return nil
}

func writeFull(f File, b []byte) error {
	n, err := f.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	return err
}

// Repaired reports what Open dropped (zero when the tail was intact).
func (w *WAL) Repaired() Repair { return w.repair }

// Err returns nil when the WAL accepts appends, else why not.
func (w *WAL) Err() error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	return w.writableLocked()
}

func (w *WAL) writableLocked() error {
	if w.failed != nil {
		return w.failed
	}
	w.mu.RLock()
	closed := w.closed
	w.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return nil
}

func (w *WAL) fail(op string, err error) error {
	w.failed = fmt.Errorf("%w: %s failed, reopen to repair: %v", ErrNotWritable, op, err)
	w.m.failures.Inc()
	w.log.Error("wal write path failed; refusing appends until reopened", "op", op, "err", err)
	return w.failed
}

// Append writes recs and returns after they are durable: their offsets are
// first..first+len(recs)-1. Concurrent callers share one write and one fsync.
// recs are not retained after Append returns.
func (w *WAL) Append(recs [][]byte) (first, last uint64, err error) {
	if len(recs) == 0 {
		return 0, 0, nil
	}
	if err := w.checkSizes(recs); err != nil {
		return 0, 0, err
	}
	r := &request{recs: recs, wake: make(chan bool, 1)}
	w.gmu.Lock()
	w.queue = append(w.queue, r)
	if w.flushing {
		w.gmu.Unlock()
		if !<-r.wake {
			return r.first, r.first + uint64(len(recs)) - 1, r.err
		}
		w.gmu.Lock()
	}
	// Lead one round: everything queued so far.
	w.flushing = true
	q := w.queue
	w.queue = nil
	w.gmu.Unlock()

	batches := make([][][]byte, len(q))
	for i, x := range q {
		batches[i] = x.recs
	}
	firsts, err := w.Write(batches)
	if err == nil {
		err = w.Sync()
	}
	for i, x := range q {
		x.err = err
		if err == nil {
			x.first = firsts[i]
		}
		if x != r {
			x.wake <- false
		}
	}
	w.gmu.Lock()
	if len(w.queue) > 0 {
		w.queue[0].wake <- true // hand leadership to the oldest waiter
	} else {
		w.flushing = false
	}
	w.gmu.Unlock()
	if r.err != nil {
		return 0, 0, r.err
	}
	return r.first, r.first + uint64(len(recs)) - 1, nil
}

func (w *WAL) checkSizes(recs [][]byte) error {
	for i, rec := range recs {
		if len(rec) == 0 || len(rec) > w.opts.MaxRecordBytes {
			return fmt.Errorf("record %d: size %d outside 1..%d", i, len(rec), w.opts.MaxRecordBytes)
		}
	}
	return nil
}

// Write frames every batch in order without fsync and returns each batch's
// first offset. The records are not visible to Read and not durable until
// Sync returns nil. A batch is never split across segments. After an error
// the WAL refuses writes (ErrNotWritable) until reopened.
func (w *WAL) Write(batches [][][]byte) ([]uint64, error) {
	for _, b := range batches {
		if err := w.checkSizes(b); err != nil {
			return nil, err
		}
	}
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	if err := w.writableLocked(); err != nil {
		return nil, err
	}
	w.mu.RLock()
	cur := w.segs[len(w.segs)-1]
	w.mu.RUnlock()
	next := cur.first + cur.count
	size := cur.size
	var total int
	for _, b := range batches {
		for _, rec := range b {
			total += frameHeaderV2 + len(rec)
		}
	}
	var (
		buf    = make([]byte, 0, min(total, int(w.opts.SegmentBytes)+frameHeaderV2))
		index  []indexEntry
		count  = cur.count
		frames = cur.frames
		firsts = make([]uint64, len(batches))
	)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		if err := writeFull(w.active, buf); err != nil {
			return w.fail("write", err)
		}
		w.synced = false
		w.mu.Lock()
		cur.size, cur.count, cur.frames, cur.last = size, count, frames, cur.first+count-1
		cur.mu.Lock()
		cur.index = append(cur.index, index...)
		cur.mu.Unlock()
		w.mu.Unlock()
		buf, index = buf[:0], nil
		return nil
	}
	for bi, b := range batches {
		if len(b) == 0 {
			firsts[bi] = next
			continue
		}
		var bsize int64
		for _, rec := range b {
			bsize += int64(frameHeaderV2 + len(rec))
		}
		if count > 0 && size+bsize > w.opts.SegmentBytes {
			if err := flush(); err != nil {
				return nil, err
			}
			if err := w.roll(next); err != nil {
				return nil, err
			}
			w.mu.RLock()
			cur = w.segs[len(w.segs)-1]
			w.mu.RUnlock()
			size, count, frames = cur.size, 0, 0
		}
		firsts[bi] = next
		for _, rec := range b {
			if frames%indexStride == 0 {
				index = append(index, indexEntry{off: next, pos: size})
			}
			buf = appendFrame(buf, next, rec, len(buf) == 0 && w.synced)
			size += int64(frameHeaderV2 + len(rec))
			count++
			frames++
			next++
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return firsts, nil
}

// roll seals the active segment (fsync) and starts a new one at first.
func (w *WAL) roll(first uint64) error {
	if err := w.syncActive(); err != nil {
		return err
	}
	if err := w.createSegment(first); err != nil {
		return w.fail("create segment", err)
	}
	return nil
}

// Sync makes everything written so far durable and visible to Read.
func (w *WAL) Sync() error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	if err := w.writableLocked(); err != nil {
		return err
	}
	return w.syncActive()
}

func (w *WAL) syncActive() error {
	if !w.opts.NoSync && !plantSkipFsync {
		start := time.Now()
		err := w.active.Sync()
		w.m.fsync.Observe(time.Since(start).Seconds())
		if err != nil {
			return w.fail("fsync", err)
		}
	}
	w.synced = true
	now := w.opts.Now()
	w.mu.Lock()
	cur := w.segs[len(w.segs)-1]
	if cur.size != cur.dsize {
		cur.modTime = now // the time of the segment's last write
		w.lastRec = cur.last
		cur.mu.Lock()
		cur.lastFrame = cur.last
		cur.mu.Unlock()
	}
	cur.dsize, cur.dcount = cur.size, cur.count
	w.durable = cur.first + cur.count - 1
	w.mu.Unlock()
	w.updateGauges()
	return nil
}

// Bounds returns the first and last durable offsets; last < first when the
// log holds no record.
func (w *WAL) Bounds() (first, last uint64) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.segs[0].first, w.durable
}

// offRange is a range of offsets, first through last.
type offRange struct{ first, last uint64 }

// maxRemovedGaps bounds WAL.removedGaps: each gap is one repair of a
// damaged log, so even a few are rare.
const maxRemovedGaps = 64

// Segments describes the segment files, oldest first.
func (w *WAL) Segments() []SegmentInfo {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]SegmentInfo, 0, len(w.segs))
	for _, s := range w.segs {
		out = append(out, SegmentInfo{Name: filepath.Base(s.path), First: s.first,
			Last: s.first + s.dcount - 1, Bytes: s.dsize, ModTime: s.modTime, Gap: s.gap})
	}
	return out
}

// Read returns up to max durable records with offsets >= from, in order.
// Offsets before the first retained record are skipped (the caller compares
// the first returned offset with from), and so are offsets that hold no
// record (skipped by a repair, FORMAT.md). Returned Data is owned by the
// caller.
func (w *WAL) Read(from uint64, max int) ([]Entry, error) {
	out, _, err := w.ReadSkip(from, max)
	return out, err
}

// ReadSkip is Read that also returns how many offsets in [from, first
// retained) retention removed, taken under the same lock as the read.
func (w *WAL) ReadSkip(from uint64, limit int) ([]Entry, uint64, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return nil, 0, ErrClosed
	}
	var skipped uint64
	if first := w.segs[0].first; from < first {
		from = max(from, 1)
		skipped = first - from
		for _, g := range w.removedGaps {
			if lo, hi := max(g.first, from), min(g.last, first-1); lo <= hi {
				skipped -= hi - lo + 1
			}
		}
		from = first
	}
	if limit <= 0 || from > w.durable {
		return nil, skipped, nil
	}
	i := sort.Search(len(w.segs), func(i int) bool { return w.segs[i].first > from }) - 1
	var out []Entry
	for ; i < len(w.segs) && len(out) < limit && from <= w.durable; i++ {
		s := w.segs[i]
		if s.dcount == 0 {
			continue
		}
		got, err := w.readSegment(s, from, limit-len(out))
		out = append(out, got...)
		if err != nil {
			return out, skipped, err
		}
		from = s.first + s.dcount
	}
	return out, skipped, nil
}

// LastRecord returns the offset of the newest durable record (offsets after
// it, up to Bounds' last, were skipped by a repair and hold none).
func (w *WAL) LastRecord() uint64 {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.lastRec
}

// readSegment reads up to limit durable records of s with offsets >= from.
// Callers hold w.mu shared.
func (w *WAL) readSegment(s *segment, from uint64, limit int) ([]Entry, error) {
	s.mu.Lock()
	if err := w.ensureIndexedLocked(s); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	pos, next := int64(headerSize), s.first
	if k := sort.Search(len(s.index), func(k int) bool { return s.index[k].off > from }) - 1; k >= 0 {
		pos, next = s.index[k].pos, s.index[k].off
	}
	rf, skips := s.rf, s.skips
	s.mu.Unlock()

	lastOff := s.first + s.dcount - 1
	// A follower at the tail reads a few bytes; a catching-up reader gets
	// large reads. Size the buffer to what can be read at most.
	fr := newFrameReader(rf, s.version, pos, s.dsize, next, w.opts.MaxRecordBytes, 256<<10)
	out := make([]Entry, 0, min(uint64(limit), lastOff-from+1))
	for len(out) < limit {
		for _, d := range skips {
			if fr.pos == d.from {
				fr.seek(d.to)
			}
		}
		var buf []byte
		fm, err := fr.read(&buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("segment %s: read at offset %d: %w", filepath.Base(s.path), max(from, next), err)
		}
		next = fm.off + 1
		if fm.off > lastOff {
			break
		}
		if fm.off >= from {
			out = append(out, Entry{Offset: fm.off, Data: buf})
		}
	}
	return out, nil
}

// ensureIndexedLocked opens the read handle and, for a sealed segment not
// read yet, scans it once: intact frames are indexed, damaged ranges are
// skipped by readers and counted as lost acknowledged data (a sealed
// segment was fsynced before its successor existed). Callers hold s.mu.
func (w *WAL) ensureIndexedLocked(s *segment) error {
	if s.rf == nil {
		f, err := w.fs.OpenFile(s.path, os.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("open segment for read: %w", err)
		}
		s.rf = f
	}
	if s.indexed {
		return nil
	}
	name := filepath.Base(s.path)
	sc, err := scanFile(s.rf, s.first, s.dsize, w.opts.MaxRecordBytes)
	if err != nil {
		return fmt.Errorf("segment %s: %w", name, err)
	}
	ver := sc.ver
	s.version = ver
	last := s.first + s.dcount - 1
	var lost []Loss
	if h := sc.header; h != nil {
		lost = append(lost, headerLoss(name, *h))
	}
	for _, d := range sc.damage {
		lost = append(lost, Loss{Segment: name, From: d.offFrom, To: d.offTo, Bytes: d.to - d.from,
			Reason: "damaged record(s) in a sealed segment (fsynced before the next segment was created)"})
	}
	skips := sc.damage
	if t := sc.tail; t != nil {
		if ver == formatV1 && t.offFrom <= last {
			// No offsets in v1 frames: what follows cannot be placed.
			return fmt.Errorf("segment %s: %w at offset %d (format version 1 cannot be resynchronised)", name, ErrCorrupt, t.offFrom)
		}
		to := last
		if sc.gap {
			to = t.offFrom - 1 // a gap segment held no record
		}
		lost = append(lost, Loss{Segment: name, From: t.offFrom, To: to, Bytes: t.to - t.from,
			Reason: "damaged end of a sealed segment"})
		skips = append(skips, *t)
	} else if s.endsAtNext && !sc.gap && sc.lastOff < last {
		// Every frame left is intact, but the segment after this one
		// starts further on and says this one ends right before it (a
		// repair's gap would be a gap segment): its tail was cut off at a
		// frame boundary.
		lost = append(lost, Loss{Segment: name, From: sc.lastOff + 1, To: last,
			Reason: fmt.Sprintf("sealed segment ends at offset %d but the next segment starts at %d: its tail is missing (the disk or a tool cut fsynced data)", sc.lastOff, last+1)})
		s.short = true
	}
	if sc.lastOff > last {
		return fmt.Errorf("segment %s: %w: holds offset %d beyond its end %d", name, ErrCorrupt, sc.lastOff, last)
	}
	s.index, s.skips, s.lastFrame, s.indexed = sc.index, skips, sc.lastOff, true
	s.frames, s.badHeader, s.gap = sc.frames, sc.header != nil, sc.gap
	w.recordLoss(lost, w.opts.AcceptDataLoss)
	return nil
}

// Retain removes whole segments, oldest first and never the active one,
// while the total size exceeds maxBytes (0: no limit) or the segment's last
// write is older than maxAge (0: no limit). It returns what it removed.
func (w *WAL) Retain(maxBytes int64, maxAge time.Duration) ([]SegmentInfo, error) {
	now := w.opts.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, ErrClosed
	}
	var total int64
	for _, s := range w.segs {
		total += s.dsize
	}
	var removed []SegmentInfo
	var err error
	for len(w.segs) > 1 {
		s := w.segs[0]
		bySize := maxBytes > 0 && total > maxBytes
		byAge := maxAge > 0 && now.Sub(s.modTime) > maxAge
		if !bySize && !byAge {
			break
		}
		s.mu.Lock()
		if s.rf != nil {
			s.rf.Close()
			s.rf = nil
		}
		s.mu.Unlock()
		if rerr := w.fs.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = fmt.Errorf("remove segment %s: %w", filepath.Base(s.path), rerr)
			break
		}
		total -= s.dsize
		removed = append(removed, SegmentInfo{Name: filepath.Base(s.path), First: s.first,
			Last: s.first + s.dcount - 1, Bytes: s.dsize, ModTime: s.modTime, Gap: s.gap})
		if s.gap && s.dcount > 0 {
			if len(w.removedGaps) == maxRemovedGaps {
				w.removedGaps = w.removedGaps[1:]
			}
			w.removedGaps = append(w.removedGaps, offRange{s.first, s.first + s.dcount - 1})
		}
		w.segs = w.segs[1:]
	}
	if len(removed) > 0 {
		if serr := w.fs.SyncDir(w.dir); serr != nil && err == nil {
			err = fmt.Errorf("sync wal dir after retention: %w", serr)
		}
		w.updateGaugesLocked()
	}
	return removed, err
}

// Size returns the total bytes of durable data in all segments.
func (w *WAL) Size() int64 {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var total int64
	for _, s := range w.segs {
		total += s.dsize
	}
	return total
}

func (w *WAL) updateGauges() {
	w.mu.RLock()
	defer w.mu.RUnlock()
	w.updateGaugesLocked()
}

func (w *WAL) updateGaugesLocked() {
	var total int64
	for _, s := range w.segs {
		total += s.dsize
	}
	w.m.segments.Set(float64(len(w.segs)))
	w.m.bytes.Set(float64(total))
}

// Close releases the files. Further calls fail with ErrClosed. Unsynced
// writes are not made durable.
func (w *WAL) Close() error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	return w.closeFiles()
}

func (w *WAL) closeFiles() error {
	var err error
	if w.active != nil {
		err = w.active.Close()
		w.active = nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.segs {
		s.mu.Lock()
		if s.rf != nil {
			s.rf.Close()
			s.rf = nil
		}
		s.mu.Unlock()
	}
	return err
}

package wal

import (
	"bufio"
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

	headerSize      = 16
	frameHeaderSize = 8
	formatVersion   = 1
	segmentSuffix   = ".seg"
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
}

// Repair reports what Open dropped from a torn or corrupt tail.
type Repair struct {
	Segment string // file name of the repaired segment, empty if none
	Records int    // records (frames) dropped, see FORMAT.md
	Bytes   int64  // bytes dropped
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
}

type segment struct {
	first   uint64
	count   uint64 // records written (durable for sealed segments)
	size    int64  // bytes written, header included
	dsize   int64  // bytes durable (fsynced)
	dcount  uint64 // records durable
	modTime time.Time
	path    string

	mu      sync.Mutex // guards rf, index, indexed
	rf      File       // read handle, opened lazily
	index   []int64    // position of record first+i*indexStride
	indexed bool
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

	// mu guards the segment list and the durable boundary. Readers hold it
	// shared while they read; writers take it exclusively only to publish.
	mu      sync.RWMutex
	segs    []*segment
	durable uint64 // last durable offset
	closed  bool

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

// Open opens (creating if needed) the WAL in dir and repairs its tail.
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
		w.log.Warn("wal tail repaired: dropped torn or corrupt records",
			"segment", w.repair.Segment, "records", w.repair.Records, "bytes", w.repair.Bytes)
		w.m.repairedRecords.Add(float64(w.repair.Records))
		w.m.repairedBytes.Add(float64(w.repair.Bytes))
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
	}
	for {
		if len(w.segs) == 0 {
			return w.createSegment(1)
		}
		last := w.segs[len(w.segs)-1]
		ok, err := w.scanLast(last)
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
	last := w.segs[len(w.segs)-1]
	f, err := w.fs.OpenFile(last.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open active segment: %w", err)
	}
	w.active = f
	w.durable = last.first + last.count - 1
	return nil
}

// scanLast checks the header and every frame of the last segment, truncates
// a torn or corrupt tail and builds the segment's index. It returns false
// when the segment has no valid header (and should be dropped).
func (w *WAL) scanLast(s *segment) (bool, error) {
	f, err := w.fs.OpenFile(s.path, os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Errorf("open last segment: %w", err)
	}
	defer f.Close()
	var hdr [headerSize]byte
	if n, err := f.ReadAt(hdr[:], 0); n < headerSize || err != nil && !errors.Is(err, io.EOF) {
		return false, nil
	}
	if !validHeader(hdr, s.first) {
		return false, nil
	}
	var (
		pos   int64 = headerSize
		count uint64
		index []int64
	)
	r := bufio.NewReaderSize(io.NewSectionReader(f, headerSize, s.size-headerSize), 1<<20)
	buf := make([]byte, 0, 4096)
	for {
		n, ferr := readFrame(r, &buf, w.opts.MaxRecordBytes)
		if ferr != nil {
			break
		}
		if count%indexStride == 0 {
			index = append(index, pos)
		}
		pos += int64(n)
		count++
	}
	if pos == s.size && !w.opts.NoSync {
		// Whatever is readable now may only sit in the page cache (a
		// write whose fsync failed before a restart of this process):
		// make it durable before anything builds on it.
		if err := f.Sync(); err != nil {
			return false, fmt.Errorf("sync last segment: %w", err)
		}
	}
	if pos < s.size {
		dropped := s.size - pos
		w.repair.Segment = filepath.Base(s.path)
		w.repair.Bytes += dropped
		w.repair.Records += countDropped(f, pos, s.size, w.opts.MaxRecordBytes)
		if err := f.Truncate(pos); err != nil {
			return false, fmt.Errorf("truncate torn segment: %w", err)
		}
		if err := f.Sync(); err != nil {
			return false, fmt.Errorf("sync repaired segment: %w", err)
		}
		s.size, s.dsize = pos, pos
	}
	s.count, s.dcount = count, count
	s.index, s.indexed = index, true
	return true, nil
}

// countDropped counts frames in [from, end) by following length prefixes.
func countDropped(f File, from, end int64, maxRec int) int {
	n := 0
	var h [frameHeaderSize]byte
	for from < end {
		if _, err := f.ReadAt(h[:], from); err != nil {
			return n + 1
		}
		l := int64(binary.LittleEndian.Uint32(h[0:4]))
		if l == 0 || l > int64(maxRec) || from+frameHeaderSize+l > end {
			return n + 1
		}
		n++
		from += frameHeaderSize + l
	}
	return n
}

func validHeader(hdr [headerSize]byte, first uint64) bool {
	return [4]byte(hdr[0:4]) == magic && hdr[4] == formatVersion &&
		binary.LittleEndian.Uint64(hdr[8:16]) == first
}

func encodeHeader(first uint64) []byte {
	var hdr [headerSize]byte
	copy(hdr[0:4], magic[:])
	hdr[4] = formatVersion
	binary.LittleEndian.PutUint64(hdr[8:16], first)
	return hdr[:]
}

// readFrame reads one frame into *buf and returns its total size.
func readFrame(r *bufio.Reader, buf *[]byte, maxRec int) (int, error) {
	var h [frameHeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, err
	}
	l := binary.LittleEndian.Uint32(h[0:4])
	if l == 0 || int64(l) > int64(maxRec) {
		return 0, fmt.Errorf("%w: implausible length %d", ErrCorrupt, l)
	}
	if cap(*buf) < int(l) {
		*buf = make([]byte, l)
	}
	*buf = (*buf)[:l]
	if _, err := io.ReadFull(r, *buf); err != nil {
		return 0, err
	}
	crc := crc32.Update(crc32.Checksum(h[0:4], castagnol), castagnol, *buf)
	if crc != binary.LittleEndian.Uint32(h[4:8]) {
		return 0, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return frameHeaderSize + int(l), nil
}

func appendFrame(dst, rec []byte) []byte {
	var h [frameHeaderSize]byte
	binary.LittleEndian.PutUint32(h[0:4], uint32(len(rec)))
	crc := crc32.Update(crc32.Checksum(h[0:4], castagnol), castagnol, rec)
	binary.LittleEndian.PutUint32(h[4:8], crc)
	dst = append(dst, h[:]...)
	return append(dst, rec...)
}

// createSegment creates and syncs an empty segment starting at first and
// appends it to the list (callers hold writeMu, or are in Open).
func (w *WAL) createSegment(first uint64) error {
	path := filepath.Join(w.dir, segmentName(first))
	f, err := w.fs.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	if err := writeFull(f, encodeHeader(first)); err != nil {
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
	s := &segment{first: first, size: headerSize, dsize: headerSize, modTime: w.opts.Now(),
		path: path, indexed: true}
	w.mu.Lock()
	w.segs = append(w.segs, s)
	w.mu.Unlock()
	if w.active != nil {
		w.active.Close()
	}
	w.active = f
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
			total += frameHeaderSize + len(rec)
		}
	}
	var (
		buf    = make([]byte, 0, min(total, int(w.opts.SegmentBytes)+frameHeaderSize))
		index  []int64
		count  = cur.count
		firsts = make([]uint64, len(batches))
	)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		if err := writeFull(w.active, buf); err != nil {
			return w.fail("write", err)
		}
		w.mu.Lock()
		cur.size, cur.count = size, count
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
			bsize += int64(frameHeaderSize + len(rec))
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
			size, count = cur.size, 0
		}
		firsts[bi] = next
		for _, rec := range b {
			if count%indexStride == 0 {
				index = append(index, size)
			}
			buf = appendFrame(buf, rec)
			size += int64(frameHeaderSize + len(rec))
			count++
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
	if !w.opts.NoSync {
		start := time.Now()
		err := w.active.Sync()
		w.m.fsync.Observe(time.Since(start).Seconds())
		if err != nil {
			return w.fail("fsync", err)
		}
	}
	now := w.opts.Now()
	w.mu.Lock()
	cur := w.segs[len(w.segs)-1]
	if cur.size != cur.dsize {
		cur.modTime = now // the time of the segment's last write
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

// Segments describes the segment files, oldest first.
func (w *WAL) Segments() []SegmentInfo {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]SegmentInfo, 0, len(w.segs))
	for _, s := range w.segs {
		out = append(out, SegmentInfo{Name: filepath.Base(s.path), First: s.first,
			Last: s.first + s.dcount - 1, Bytes: s.dsize, ModTime: s.modTime})
	}
	return out
}

// Read returns up to max durable records with offsets >= from, in order.
// Offsets before the first retained record are skipped (the caller compares
// the first returned offset with from). Returned Data is owned by the caller.
func (w *WAL) Read(from uint64, max int) ([]Entry, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return nil, ErrClosed
	}
	if max <= 0 || from > w.durable {
		return nil, nil
	}
	if from < w.segs[0].first {
		from = w.segs[0].first
	}
	i := sort.Search(len(w.segs), func(i int) bool { return w.segs[i].first > from }) - 1
	var out []Entry
	for ; i < len(w.segs) && len(out) < max && from <= w.durable; i++ {
		s := w.segs[i]
		if s.dcount == 0 {
			continue
		}
		got, err := w.readSegment(s, from, max-len(out))
		if err != nil {
			return out, err
		}
		out = append(out, got...)
		from = s.first + s.dcount
	}
	return out, nil
}

// readSegment reads up to limit durable records of s starting at from.
// Callers hold w.mu shared.
func (w *WAL) readSegment(s *segment, from uint64, limit int) ([]Entry, error) {
	s.mu.Lock()
	if s.rf == nil {
		f, err := w.fs.OpenFile(s.path, os.O_RDONLY, 0)
		if err != nil {
			s.mu.Unlock()
			return nil, fmt.Errorf("open segment for read: %w", err)
		}
		s.rf = f
	}
	if !s.indexed {
		if err := w.buildIndex(s); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	rel := from - s.first
	pos := s.index[rel/indexStride]
	skip := rel % indexStride
	rf := s.rf
	s.mu.Unlock()

	// A follower at the tail reads a few bytes; a catching-up reader gets
	// large reads. Size the buffer to what can be read at most.
	r := bufio.NewReaderSize(io.NewSectionReader(rf, pos, s.dsize-pos), int(min(256<<10, max(s.dsize-pos, 4096))))
	var buf []byte
	for ; skip > 0; skip-- {
		if _, err := readFrame(r, &buf, w.opts.MaxRecordBytes); err != nil {
			return nil, fmt.Errorf("segment %s: skip to offset %d: %w", filepath.Base(s.path), from, err)
		}
	}
	n := s.first + s.dcount - from
	if uint64(limit) < n {
		n = uint64(limit)
	}
	out := make([]Entry, 0, n)
	for k := uint64(0); k < n; k++ {
		buf = nil
		if _, err := readFrame(r, &buf, w.opts.MaxRecordBytes); err != nil {
			return out, fmt.Errorf("segment %s: read offset %d: %w", filepath.Base(s.path), from+k, err)
		}
		out = append(out, Entry{Offset: from + k, Data: buf})
	}
	return out, nil
}

// buildIndex scans a sealed segment once. Callers hold s.mu.
func (w *WAL) buildIndex(s *segment) error {
	var hdr [headerSize]byte
	if _, err := s.rf.ReadAt(hdr[:], 0); err != nil || !validHeader(hdr, s.first) {
		return fmt.Errorf("segment %s: %w: bad header", filepath.Base(s.path), ErrCorrupt)
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.rf, headerSize, s.dsize-headerSize), 1<<20)
	var (
		pos   int64 = headerSize
		index []int64
		buf   []byte
	)
	for k := uint64(0); k < s.dcount; k++ {
		if k%indexStride == 0 {
			index = append(index, pos)
		}
		n, err := readFrame(r, &buf, w.opts.MaxRecordBytes)
		if err != nil {
			return fmt.Errorf("segment %s: index record %d of %d: %w", filepath.Base(s.path), k, s.dcount, err)
		}
		pos += int64(n)
	}
	s.index, s.indexed = index, true
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
			Last: s.first + s.dcount - 1, Bytes: s.dsize, ModTime: s.modTime})
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

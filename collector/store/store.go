package store

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/wal"
	"github.com/eventpipe/eventpipe/sinks"
)

var (
	// ErrNotWritable is wrapped by Append errors after a failed write or
	// fsync: retryable (gRPC Unavailable). The store repairs itself by
	// reopening the log on the next Append or Run tick.
	ErrNotWritable = wal.ErrNotWritable
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("store closed")
	// ErrInvalid is wrapped by Append errors about the batch itself (nil
	// occurrence, oversized occurrence, missing cluster or stream): not
	// retryable (gRPC InvalidArgument).
	ErrInvalid = errors.New("invalid batch")
	// ErrDataLoss is wrapped by Open's error when acknowledged records are
	// damaged or missing and Config.AcceptDataLoss is false.
	ErrDataLoss = wal.ErrDataLoss
)

const defaultTick = 30 * time.Second

// Store is the collector's durable state. Safe for concurrent use.
type Store struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	walm *wal.Metrics
	fs   wal.FS
	now  func() time.Time
	tick time.Duration
	sem  *semaphore.Weighted
	lock *dirLock

	walMu sync.RWMutex // guards w (swapped by repair)
	w     *wal.WAL

	commitMu sync.Mutex // one commit round or repair at a time
	ckpt     *checkpointer
	ckptErr  error

	mu        sync.Mutex
	index     map[idKey]int64    // committed ids -> stored-at (no pointers: the GC skips it)
	pending   map[idKey]*request // ids reserved by batches not committed yet
	order     []idxItem          // insertion order, for expiry and eviction
	evicted   bool               // logged the first eviction
	cursors   map[streamKey]string
	consumers map[string]uint64 // committed offset per known consumer
	lost      map[string]uint64
	notify    chan struct{}
	closed    bool
	repairs   uint64 // generation: incremented by every repair

	// stuck is the lowest offset a Read could not get past (a damaged log
	// a consumer cannot progress through), nil when every read that failed
	// has since got past it. Readable reports it to /readyz.
	stuckMu sync.Mutex
	stuck   *readFailure

	gmu      sync.Mutex
	queue    []*request
	flushing bool
}

var _ sinks.Source = (*Store)(nil)

type idxItem struct {
	key idKey
	at  int64
}

// idKey is a 128-bit hash of an event_id: a quarter of the memory of the
// string and a collision chance (2^-128 per pair) that cannot matter. The
// seeds are per process: the index is rebuilt from the log on every open.
type idKey [2]uint64

var idSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func keyOf(id string) idKey {
	return idKey{maphash.String(idSeeds[0], id), maphash.String(idSeeds[1], id)}
}

type request struct {
	key    streamKey
	rv     string
	recs   [][]byte
	recIDs []idKey // key of each record's event_id (zero when none)
	ids    []idKey // ids reserved by this request
	redup  int     // records dropped as duplicates after a repair
	deps   []*request
	at     int64  // stored-at of its records, unix nanos
	gen    uint64 // repair generation when it was admitted
	first  uint64
	err    error
	wake   chan bool     // false: done; true: lead the next round
	done   chan struct{} // closed when the request's round finished
}

// AppendResult tells what one Append did.
type AppendResult struct {
	// Stored: occurrences newly written; Duplicates: recognised as stored
	// within the dedupe window (or repeated inside the batch).
	Stored, Duplicates int
	// LastOffset is the offset of the last record stored by this call (0 if
	// none).
	LastOffset uint64
}

type options struct {
	fs   wal.FS
	now  func() time.Time
	tick time.Duration
}

// Open opens or creates the store in cfg.Dir, repairing a torn log tail and
// rebuilding the dedupe index from the log.
func Open(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Store, error) {
	return openWith(cfg, logger, reg, options{})
}

func openWith(cfg Config, logger *slog.Logger, reg prometheus.Registerer, o options) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("storage config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if o.fs == nil {
		o.fs = defaultFS()
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.tick <= 0 {
		o.tick = defaultTick
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	walm, err := wal.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Store{
		cfg: cfg, log: logger, m: m, walm: walm, fs: o.fs, now: o.now, tick: o.tick,
		sem:       semaphore.NewWeighted(cfg.MaxInflightBytes),
		consumers: map[string]uint64{},
		lost:      map[string]uint64{},
		notify:    make(chan struct{}),
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "cursors")} {
		if err := o.fs.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	if s.lock, err = lockDir(cfg.Dir); err != nil {
		return nil, err
	}
	if err := o.fs.SyncDir(cfg.Dir); err != nil {
		s.lock.release()
		return nil, fmt.Errorf("sync data dir: %w", err)
	}
	if err := s.openLocked(); err != nil {
		s.lock.release()
		if errors.Is(err, ErrDataLoss) {
			s.log.Error("REFUSING TO START: acknowledged records in the log are damaged or missing; the log was not modified. "+
				"Copy the data directory if you want to keep the evidence, then set store.accept_data_loss: true for one start "+
				"to keep every intact record and count the loss (eventpipe_collector_log_data_loss_records_total)",
				"dir", cfg.Dir, "err", err)
		}
		return nil, err
	}
	first, last := s.w.Bounds()
	s.log.Info("log opened", "dir", cfg.Dir, "first", first, "last", last,
		"dedupe_index", len(s.index), "cluster_cursors", len(s.cursors))
	return s, nil
}

// ackedThrough returns the highest offset a consumer committed (on disk or,
// after a repair in this process, in memory): evidence that every offset up
// to it was acknowledged and seen.
func (s *Store) ackedThrough() (uint64, error) {
	var hi uint64
	dir := filepath.Join(s.cfg.Dir, "cursors")
	entries, err := s.fs.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("list consumer cursors: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasSuffix(name, ".tmp") || !consumerName.MatchString(name) {
			continue
		}
		off, err := (&consumerCursor{s: s, name: name, path: filepath.Join(dir, name)}).Load()
		if err != nil {
			return 0, err
		}
		hi = max(hi, off)
	}
	s.mu.Lock()
	for _, off := range s.consumers {
		hi = max(hi, off)
	}
	s.mu.Unlock()
	return hi, nil
}

// openLocked (re)opens the log and the checkpoint and rebuilds the dedupe
// index, keeping reservations of batches still waiting to commit. Callers
// hold commitMu (or are in Open).
func (s *Store) openLocked() error {
	acked, err := s.ackedThrough()
	if err != nil {
		return err
	}
	w, err := wal.Open(filepath.Join(s.cfg.Dir, "log"), wal.Options{
		SegmentBytes: s.cfg.SegmentBytes, MaxRecordBytes: envelopeSize + maxOccurrenceLen,
		FS: s.fs, Logger: s.log.With("part", "wal"), Metrics: s.walm, NoSync: !s.cfg.Fsync, Now: s.now,
		AckedThrough: acked, AcceptDataLoss: s.cfg.AcceptDataLoss,
	})
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	// A checkpoint is trusted only up to the newest record and below a torn
	// write: the agent does not re-send what the cursor says is stored.
	last := w.LastRecord()
	if r := w.Repaired(); r.TornFrom > 0 {
		last = min(last, r.TornFrom-1)
	}
	ckpt, cp, err := openCheckpointer(s.fs, s.cfg.Dir, s.cfg.Fsync, last)
	if err != nil {
		w.Close()
		return err
	}
	index, order, err := s.rebuildIndex(w)
	if err == nil && len(w.Lost()) > 0 {
		// Rebuilding read sealed segments: damage found there refuses the
		// start as well, or, accepted, is rewritten away so that the next
		// start does not refuse it again.
		if s.cfg.AcceptDataLoss {
			err = w.RewriteDamaged()
		} else {
			err = fmt.Errorf("open log: %w", &wal.DataLossError{Dir: filepath.Join(s.cfg.Dir, "log"), Lost: w.Lost()})
		}
	}
	if err != nil {
		w.Close()
		ckpt.close()
		return err
	}
	s.walMu.Lock()
	old := s.w
	s.w = w
	s.walMu.Unlock()
	if old != nil {
		old.Close()
	}
	if s.ckpt != nil {
		s.ckpt.close()
	}
	s.ckpt, s.ckptErr = ckpt, nil
	s.mu.Lock()
	if s.pending == nil {
		s.pending = map[idKey]*request{}
	}
	s.index, s.order, s.cursors = index, order, cp.cursors
	s.repairs++
	s.mu.Unlock()
	s.updateOffsetGauges()
	return nil
}

// rebuildIndex reads the records stored within the dedupe window.
func (s *Store) rebuildIndex(w *wal.WAL) (map[idKey]int64, []idxItem, error) {
	index := map[idKey]int64{}
	var order []idxItem
	cutoff := s.now().Add(-s.cfg.DedupeWindow)
	from := uint64(0)
	for _, seg := range w.Segments() {
		if !seg.ModTime.Before(cutoff) {
			from = seg.First
			break
		}
	}
	if from == 0 {
		return index, order, nil
	}
	for {
		entries, err := w.Read(from, 4096)
		if err != nil {
			return nil, nil, fmt.Errorf("rebuild dedupe index at offset %d: %w", from, err)
		}
		if len(entries) == 0 {
			return index, order, nil
		}
		for _, e := range entries {
			at, kind, payload, err := decodeEnvelope(e.Data)
			if err != nil || kind != kindOccurrence {
				return nil, nil, fmt.Errorf("rebuild dedupe index at offset %d: %w", e.Offset, errOr(err, errBadRecord))
			}
			if at.Before(cutoff) {
				continue
			}
			if id := eventID(payload); id != "" {
				k := keyOf(id)
				index[k] = at.UnixNano()
				order = append(order, idxItem{k, at.UnixNano()})
				for len(index) > s.cfg.DedupeMaxEntries && len(order) > 0 {
					if at, ok := index[order[0].key]; ok && at == order[0].at {
						delete(index, order[0].key)
					}
					order = order[1:]
				}
			}
		}
		from = entries[len(entries)-1].Offset + 1
	}
}

func errOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// eventID extracts Occurrence.event_id (field 2) without decoding the rest.
func eventID(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 2 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ""
			}
			return string(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

func (s *Store) wal() *wal.WAL {
	s.walMu.RLock()
	defer s.walMu.RUnlock()
	return s.w
}

// Append stores the occurrences whose event_id was not stored within the
// dedupe window and records (cluster, stream) -> resourceVersion, in one
// durable step, then returns. Concurrent callers share fsyncs. When
// in-flight bytes exceed MaxInflightBytes, Append blocks (ctx-aware). Empty
// occs with a resourceVersion only advances the cluster cursor (bookmarks).
// An empty resourceVersion leaves the cursor unchanged. An occurrence with
// an empty event_id is stored without de-duplication. occs are not retained
// after Append returns.
func (s *Store) Append(ctx context.Context, cluster, stream, resourceVersion string, occs []*eventpipev1.Occurrence) (AppendResult, error) {
	res, err := s.append(ctx, cluster, stream, resourceVersion, occs)
	if err != nil {
		s.m.appendErrors.Inc()
	}
	return res, err
}

func (s *Store) append(ctx context.Context, cluster, stream, rv string, occs []*eventpipev1.Occurrence) (AppendResult, error) {
	var res AppendResult
	if rv != "" && (cluster == "" || stream == "") {
		return res, fmt.Errorf("%w: cluster and stream are required with a resourceVersion", ErrInvalid)
	}
	// Each record is encoded once, envelope first; the stored-at time is
	// patched in when the batch is admitted (setStoredAt).
	encoded := make([][]byte, len(occs))
	var total int64
	for i, o := range occs {
		if o == nil {
			return res, fmt.Errorf("%w: occurrence %d is nil", ErrInvalid, i)
		}
		size := proto.Size(o)
		if size > maxOccurrenceLen {
			return res, fmt.Errorf("%w: occurrence %d (%s) is %d bytes, limit %d", ErrInvalid, i, o.GetEventId(), size, maxOccurrenceLen)
		}
		rec := appendEnvelope(make([]byte, 0, envelopeSize+size), time.Time{}, kindOccurrence)
		rec, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(rec, o)
		if err != nil {
			return res, fmt.Errorf("%w: occurrence %d (%s): %v", ErrInvalid, i, o.GetEventId(), err)
		}
		encoded[i] = rec
		total += int64(len(rec))
	}
	weight := min(max(total, 1), s.cfg.MaxInflightBytes)
	if err := s.sem.Acquire(ctx, weight); err != nil {
		return res, fmt.Errorf("wait for log capacity: %w", err)
	}
	s.m.inflight.Add(float64(weight))
	defer func() {
		s.m.inflight.Sub(float64(weight))
		s.sem.Release(weight)
	}()

	r := &request{key: streamKey{cluster, stream}, rv: rv, wake: make(chan bool, 1), done: make(chan struct{})}
	now := s.now()
	nowNs := now.UnixNano()
	cutoff := now.Add(-s.cfg.DedupeWindow).UnixNano()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return res, ErrClosed
	}
	s.expireLocked(cutoff)
	r.at, r.gen = nowNs, s.repairs
	seen := make(map[idKey]bool, len(occs))
	for i, o := range occs {
		var id idKey
		if o.GetEventId() != "" {
			id = keyOf(o.GetEventId())
			if seen[id] {
				res.Duplicates++
				continue
			}
			seen[id] = true
			if p, ok := s.pending[id]; ok {
				res.Duplicates++
				r.deps = append(r.deps, p)
				continue
			}
			if at, ok := s.index[id]; ok && at >= cutoff && !plantNoDedupe {
				res.Duplicates++
				continue
			}
			s.evictLocked()
			s.pending[id] = r
			r.ids = append(r.ids, id)
		}
		setStoredAt(encoded[i], now)
		r.recs = append(r.recs, encoded[i])
		r.recIDs = append(r.recIDs, id)
	}
	s.mu.Unlock()
	if res.Duplicates > 0 {
		s.m.deduplicated.Add(float64(res.Duplicates))
	}
	if len(r.recs) == 0 && rv == "" && len(r.deps) == 0 {
		return res, nil
	}

	s.submit(r)
	for _, d := range r.deps {
		<-d.done
		if d.err != nil && r.err == nil {
			r.err = fmt.Errorf("a duplicate occurrence was being stored by a concurrent batch that failed: %w", d.err)
		}
	}
	if r.err != nil {
		return AppendResult{}, r.err
	}
	res.Stored = len(r.recs)
	if r.redup > 0 {
		res.Duplicates += r.redup
		s.m.deduplicated.Add(float64(r.redup))
	}
	if res.Stored > 0 {
		res.LastOffset = r.first + uint64(res.Stored) - 1
	}
	return res, nil
}

// submit runs r through a group commit: the first caller leads a round with
// everything queued, then hands leadership to the oldest waiter.
func (s *Store) submit(r *request) {
	s.gmu.Lock()
	s.queue = append(s.queue, r)
	if s.flushing {
		s.gmu.Unlock()
		if !<-r.wake {
			return
		}
		s.gmu.Lock()
	}
	s.flushing = true
	q := s.queue
	s.queue = nil
	s.gmu.Unlock()

	s.commitRound(q)
	for _, x := range q {
		close(x.done)
		if x != r {
			x.wake <- false
		}
	}
	s.gmu.Lock()
	if len(s.queue) > 0 {
		s.queue[0].wake <- true
	} else {
		s.flushing = false
	}
	s.gmu.Unlock()
}

// commitRound writes every request's records with one write, one log
// fsync, then one checkpoint fsync, and publishes the result.
func (s *Store) commitRound(q []*request) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	err := s.writableLocked()
	if err != nil && errors.Is(err, ErrNotWritable) {
		if rerr := s.repairLocked(); rerr != nil {
			err = fmt.Errorf("%w (repair failed: %v)", err, rerr)
		} else {
			err = nil
		}
	}
	if err == nil {
		s.dropStoredAfterRepair(q)
	}
	w := s.wal()
	var firsts []uint64
	if err == nil {
		batches := make([][][]byte, len(q))
		for i, r := range q {
			batches[i] = r.recs
		}
		firsts, err = w.Write(batches)
	}
	// The cluster cursors of this round. The checkpoint is fsynced in
	// parallel with the log: it records the log offset it describes and
	// Open ignores (and clears) a checkpoint that is ahead of the log, so
	// it is never trusted before the data it covers is durable.
	var (
		next    map[streamKey]string
		changed bool
		ckptCh  chan error
	)
	if err == nil {
		s.mu.Lock()
		next = make(map[streamKey]string, len(s.cursors)+1)
		for k, v := range s.cursors {
			next[k] = v
		}
		s.mu.Unlock()
		for _, r := range q {
			if r.rv != "" && next[r.key] != r.rv {
				next[r.key] = r.rv
				changed = true
			}
		}
		if changed {
			_, lastW := w.Bounds()
			for i, r := range q {
				if len(r.recs) > 0 {
					lastW = firsts[i] + uint64(len(r.recs)) - 1
				}
			}
			ckptCh = make(chan error, 1)
			cp := checkpoint{lastOffset: lastW, cursors: next}
			go func() { ckptCh <- s.ckpt.write(cp, s.now()) }()
		}
		err = w.Sync()
	}
	var ckptErr error
	if ckptCh != nil {
		if ckptErr = <-ckptCh; ckptErr != nil {
			ckptErr = fmt.Errorf("%w: record cluster cursor: %v", ErrNotWritable, ckptErr)
			s.ckptErr = ckptErr
			s.log.Error("checkpoint write failed; refusing appends until repaired", "err", ckptErr)
		}
	}
	if err != nil {
		err = fmt.Errorf("append to log: %w", err)
		s.mu.Lock()
		for _, r := range q {
			r.err = err
			for _, id := range r.ids {
				if s.pending[id] == r {
					delete(s.pending, id)
				}
			}
		}
		s.mu.Unlock()
		return
	}
	stored := 0
	s.mu.Lock()
	for i, r := range q {
		r.first = firsts[i]
		stored += len(r.recs)
		for _, id := range r.ids {
			if s.pending[id] == r {
				delete(s.pending, id)
				s.index[id] = r.at
				// Ordered by commit, which is close to admission order;
				// a rebuild by a repair never loses a pending id's item.
				s.order = append(s.order, idxItem{id, r.at})
			}
		}
		if ckptErr != nil && r.rv != "" {
			r.err = ckptErr
		}
	}
	if ckptErr == nil && changed {
		s.cursors = next
	}
	close(s.notify)
	s.notify = make(chan struct{})
	s.mu.Unlock()
	s.m.appended.Add(float64(stored))
	s.updateOffsetGauges()
}

// dropStoredAfterRepair removes, from the requests admitted before the last
// repair, the records that the repaired log already holds: a write whose
// fsync failed can still be in the file, intact, and is then stored (the
// reopen fsynced it); storing it again would duplicate it.
func (s *Store) dropStoredAfterRepair(q []*request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range q {
		if r.gen == s.repairs {
			continue
		}
		keep := 0
		for i, id := range r.recIDs {
			if id != (idKey{}) {
				if _, ok := s.index[id]; ok {
					r.redup++
					continue
				}
			}
			r.recs[keep], r.recIDs[keep] = r.recs[i], r.recIDs[i]
			keep++
		}
		r.recs, r.recIDs = r.recs[:keep], r.recIDs[:keep]
	}
}

func (s *Store) writableLocked() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if s.ckptErr != nil {
		return s.ckptErr
	}
	return s.wal().Err()
}

// repairLocked reopens the log (truncating whatever a failed write left)
// and the checkpoint. Callers hold commitMu.
func (s *Store) repairLocked() error {
	s.log.Warn("repairing the log after a write failure")
	if err := s.openLocked(); err != nil {
		return fmt.Errorf("repair log: %w", err)
	}
	s.log.Info("log repaired and writable again", "repair", s.wal().Repaired())
	return nil
}

func (s *Store) expireLocked(cutoff int64) {
	i := 0
	for ; i < len(s.order) && s.order[i].at < cutoff; i++ {
		it := s.order[i]
		if at, ok := s.index[it.key]; ok && at == it.at {
			delete(s.index, it.key)
		}
	}
	if i > 0 {
		s.order = s.order[i:]
		if cap(s.order) > 1024 && len(s.order) < cap(s.order)/4 {
			s.order = append([]idxItem(nil), s.order...)
		}
	}
}

// evictLocked makes room for one entry when the index is full, dropping the
// oldest committed entries: de-duplication then covers less than the window,
// which is counted and logged (the bound keeps memory finite).
func (s *Store) evictLocked() {
	if len(s.index)+len(s.pending) < s.cfg.DedupeMaxEntries {
		return
	}
	n := 0
	i := 0
	for ; i < len(s.order) && len(s.index)+len(s.pending) >= s.cfg.DedupeMaxEntries; i++ {
		it := s.order[i]
		if at, ok := s.index[it.key]; ok && at == it.at {
			delete(s.index, it.key)
			n++
		}
	}
	s.order = s.order[i:]
	if n > 0 {
		s.m.dedupeEvicted.Add(float64(n))
		if !s.evicted {
			s.evicted = true
			s.log.Warn("dedupe index full: evicting the oldest event ids before the window ends",
				"dedupe_max_entries", s.cfg.DedupeMaxEntries, "dedupe_window", s.cfg.DedupeWindow)
		}
	}
}

func (s *Store) updateOffsetGauges() {
	first, last := s.wal().Bounds()
	s.m.firstOffset.Set(float64(first))
	s.m.lastOffset.Set(float64(last))
}

// ClusterCursor returns the last durably recorded resourceVersion of
// (cluster, stream).
func (s *Store) ClusterCursor(cluster, stream string) (resourceVersion string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, ok := s.cursors[streamKey{cluster, stream}]
	return rv, ok
}

// Read returns up to max records with Offset >= from (from 0 reads from
// the start) in offset order without blocking; skipped counts records in
// [from, first returned) removed by retention.
func (s *Store) Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if from == 0 {
		from = 1
	}
	// skipped counts retention only: offsets a repair skipped hold no
	// record and were counted when the log was opened.
	s.walMu.RLock()
	entries, skipped, err := s.w.ReadSkip(from, max)
	s.walMu.RUnlock()
	out, err := s.decode(from, entries, err)
	s.noteRead(from, out, err)
	return out, skipped, err
}

// decode turns log entries read from from into records; readErr is the
// log's error after those entries.
func (s *Store) decode(from uint64, entries []wal.Entry, readErr error) ([]sinks.Record, error) {
	if readErr != nil && len(entries) == 0 {
		return nil, fmt.Errorf("read log at %d: %w", from, readErr)
	}
	out := make([]sinks.Record, 0, len(entries))
	for _, e := range entries {
		_, kind, payload, derr := decodeEnvelope(e.Data)
		if derr == nil && kind != kindOccurrence {
			derr = fmt.Errorf("%w: kind %d", errBadRecord, kind)
		}
		occ := &eventpipev1.Occurrence{}
		if derr == nil {
			derr = proto.Unmarshal(payload, occ)
		}
		if derr != nil {
			return out, fmt.Errorf("decode record %d: %w", e.Offset, derr)
		}
		out = append(out, sinks.Record{Offset: e.Offset, Occurrence: occ})
	}
	if readErr != nil {
		return out, fmt.Errorf("read log after %d: %w", from, readErr)
	}
	return out, nil
}

// readFailure is where a Read stopped and why.
type readFailure struct {
	at  uint64
	err error
}

// noteRead remembers the lowest offset a read could not get past and
// forgets it once a read got past it: a consumer retrying a read that
// fails (a damaged record it cannot decode, a segment it cannot read) is
// stuck for ever, which /readyz must show (Readable).
func (s *Store) noteRead(from uint64, out []sinks.Record, err error) {
	at := from
	if len(out) > 0 {
		at = out[len(out)-1].Offset + 1
	}
	s.stuckMu.Lock()
	defer s.stuckMu.Unlock()
	switch {
	case err != nil && (errors.Is(err, ErrClosed) || errors.Is(err, wal.ErrClosed)):
	case err != nil:
		if s.stuck == nil || at <= s.stuck.at {
			s.stuck = &readFailure{at: at, err: err}
		}
	case s.stuck != nil && from <= s.stuck.at && (len(out) == 0 || at > s.stuck.at):
		s.stuck = nil
	}
}

// Readable returns nil unless a read of the log failed at an offset no
// later read got past (consumers starting there cannot progress).
func (s *Store) Readable() error {
	s.stuckMu.Lock()
	defer s.stuckMu.Unlock()
	if s.stuck == nil {
		return nil
	}
	return fmt.Errorf("consumers cannot read past offset %d: %w", s.stuck.at, s.stuck.err)
}

// Wait blocks until a record with Offset > after exists, or ctx ends.
func (s *Store) Wait(ctx context.Context, after uint64) error {
	for {
		s.mu.Lock()
		ch, closed := s.notify, s.closed
		s.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if s.wal().LastRecord() > after {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Bounds returns the first retained and last stored offsets (last < first
// when the log is empty).
func (s *Store) Bounds() (first, last uint64) { return s.wal().Bounds() }

// LastRecord returns the offset of the newest record. It is below Bounds'
// last when a repair skipped offsets at the end of the log (a torn tail, an
// accepted data loss): those offsets are never reused and hold nothing, so
// a consumer that handled LastRecord has nothing left to read.
func (s *Store) LastRecord() uint64 { return s.wal().LastRecord() }

// Lost reports, per consumer, records removed by retention before that
// consumer read them, as its sink runner counted them (since Open; every
// known consumer is listed).
func (s *Store) Lost() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.consumers))
	for name := range s.consumers {
		out[name] = s.lost[name]
	}
	return out
}

// Repaired reports what the last open or repair of the log found: the torn
// tail it dropped (eventpipe_collector_log_repaired_records_total) and any
// acknowledged data found lost (eventpipe_collector_log_data_loss_records_total).
func (s *Store) Repaired() wal.Repair { return s.wal().Repaired() }

// DataLoss lists the acknowledged data found damaged or missing since the
// log was opened: at open (accepted with AcceptDataLoss) and when a sealed
// segment was first read.
func (s *Store) DataLoss() []wal.Loss { return s.wal().Lost() }

// Writable returns nil when the log accepts appends.
func (s *Store) Writable() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.writableLocked()
}

// Run applies retention periodically, expires the dedupe index and repairs
// the log after a write failure; it returns nil when ctx ends.
func (s *Store) Run(ctx context.Context) error {
	t := time.NewTicker(s.tick)
	defer t.Stop()
	for {
		s.maintain()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Store) maintain() {
	if _, err := s.ApplyRetention(); err != nil {
		s.log.Error("retention failed", "err", err)
	}
	cutoff := s.now().Add(-s.cfg.DedupeWindow).UnixNano()
	s.mu.Lock()
	s.expireLocked(cutoff)
	s.mu.Unlock()
	s.commitMu.Lock()
	if err := s.writableLocked(); errors.Is(err, ErrNotWritable) {
		if rerr := s.repairLocked(); rerr != nil {
			s.log.Error("log still not writable", "err", rerr)
		}
	}
	s.commitMu.Unlock()
}

// ApplyRetention removes whole segments beyond the size and age bounds now
// and returns how many records it removed. Run calls it periodically.
func (s *Store) ApplyRetention() (uint64, error) {
	s.walMu.RLock()
	removed, err := s.w.Retain(s.cfg.Retention.MaxBytes, s.cfg.Retention.MaxAge)
	s.walMu.RUnlock()
	var total uint64
	for _, seg := range removed {
		if seg.Gap {
			// Its offsets never held a record: their loss was counted
			// when the repair skipped them, not again here.
			s.log.Info("retention removed a gap segment", "segment", seg.Name, "first", seg.First, "last", seg.Last)
			continue
		}
		if seg.Last < seg.First {
			continue
		}
		n := seg.Last - seg.First + 1
		total += n
		s.log.Info("retention removed a segment", "segment", seg.Name, "first", seg.First, "last", seg.Last, "bytes", seg.Bytes)
		// Which consumer lost which of these records only the consumer
		// knows (it may hold records it read but has not delivered yet):
		// the sink runner counts them and reports them to its cursor
		// (consumerCursor.Lost).
	}
	s.m.retention.Add(float64(total))
	s.updateOffsetGauges()
	if err != nil {
		return total, fmt.Errorf("apply retention: %w", err)
	}
	return total, nil
}

// Close stops accepting appends, waits for the commit in progress and
// releases the files. Waiters in Wait return ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.notify)
	s.notify = make(chan struct{})
	s.mu.Unlock()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	var errs []error
	s.walMu.Lock()
	if err := s.w.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close log: %w", err))
	}
	s.walMu.Unlock()
	if err := s.ckpt.close(); err != nil {
		errs = append(errs, fmt.Errorf("close checkpoint: %w", err))
	}
	if err := s.lock.release(); err != nil {
		errs = append(errs, fmt.Errorf("release data dir lock: %w", err))
	}
	return errors.Join(errs...)
}

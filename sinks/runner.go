package sinks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SourceHead is optionally implemented by a Source that knows the offset of
// its last record (a Source with a method Bounds() (first, last uint64), as
// collector/store has, works too). A Runner uses it so that LagRecords
// counts records it has not read yet; without it the lag only covers what
// the runner has seen. A Source with both reports the newest record here
// and, in Bounds, the last offset assigned (higher when a repair skipped
// offsets that hold no record): the lag uses the first, the check of a
// committed cursor the second.
type SourceHead interface {
	LastOffset() uint64
}

// Status is a snapshot of one runner, for /readyz, logs and tests.
type Status struct {
	// Name is the sink's configured name.
	Name string
	// Running is true between the start and the end of Run.
	Running bool
	// Cursor is the last committed offset (0: nothing yet).
	Cursor uint64
	// Handled is the last offset up to which every record is handled
	// (delivered, dropped, filtered or lost). It runs ahead of Cursor by at
	// most commit_interval's worth of records while records flow, and
	// equals it once the runner has caught up or stopped.
	Handled uint64
	// LastOffset is the highest log offset the runner knows of.
	LastOffset uint64
	// LagRecords is LastOffset - Handled: the records not handled yet.
	LagRecords uint64
	// LagSeconds is the age of the oldest record read but not delivered
	// (by its observed_at), 0 when caught up.
	LagSeconds float64
	// LastError is the last push, read or commit error; empty after a
	// successful push.
	LastError string
	// Counters since this Runner was created.
	Sent     uint64
	Failed   uint64 // permanently refused and dropped (whole batches and partial)
	Filtered uint64
	Lost     uint64 // removed by retention before being read
}

// Runner moves records from a Source to one Pusher: it reads from the
// cursor, filters, batches by size and time, pushes with retry, and commits
// the cursor after pushes that ended (delivered, or refused for good and
// counted), at most once per commit_interval while records flow and always
// when it catches up or stops. See the package doc for the full contract.
type Runner struct {
	cfg    RunnerConfig
	p      Pusher
	src    Source
	cur    Cursor
	log    *slog.Logger
	m      *sinkMetrics
	filter atomic.Pointer[filter]

	// sleep waits d or until ctx ends; replaced in tests.
	sleep func(ctx context.Context, d time.Duration) error

	running atomic.Bool
	mu      sync.Mutex
	st      Status
	oldest  time.Time // observed_at of the oldest undelivered record read, zero if none

	// lastCommit is when the cursor was last committed (Run's goroutine
	// only).
	lastCommit time.Time
	// lostThrough is the highest offset counted as lost (under mu): a loss
	// seen early (while a push is retried) is not counted again when the
	// read reaches it.
	lostThrough uint64
}

// NewRunner checks cfg and builds a runner. logger and reg may be nil.
// Several runners (with different names) may share one Registerer.
func NewRunner(cfg RunnerConfig, p Pusher, src Source, cur Cursor, logger *slog.Logger, reg prometheus.Registerer) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sink runner config: %w", err)
	}
	if p == nil || src == nil || cur == nil {
		return nil, fmt.Errorf("sink %q: pusher, source and cursor are required", cfg.Name)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := newMetrics()
	if err := m.register(reg); err != nil {
		return nil, fmt.Errorf("sink %q: register metrics: %w", cfg.Name, err)
	}
	r := &Runner{
		cfg:   cfg,
		p:     p,
		src:   src,
		cur:   cur,
		log:   logger.With("sink", cfg.Name),
		m:     m.forSink(cfg.Name),
		sleep: sleepCtx,
	}
	r.st.Name = cfg.Name
	r.filter.Store(compileFilter(cfg.Filter))
	return r, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// SetFilter replaces the filter atomically (hot reload). It applies to the
// records read after the call; a batch already collected is pushed as is.
func (r *Runner) SetFilter(f FilterConfig) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("sink %q: %w", r.cfg.Name, err)
	}
	r.filter.Store(compileFilter(f))
	r.log.Info("sink filter replaced")
	return nil
}

// Name is the sink's configured name.
func (r *Runner) Name() string { return r.cfg.Name }

// Status returns a snapshot.
func (r *Runner) Status() Status {
	r.observeHead(0) // a runner stuck retrying still reports the log's growth
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	st.Running = r.running.Load()
	if !r.oldest.IsZero() {
		st.LagSeconds = time.Since(r.oldest).Seconds()
	}
	return st
}

// Run blocks until ctx ends. It returns nil after a clean stop, or an error
// when it cannot start (cursor unreadable, already running). On stop the
// in-flight push is abandoned (its context is cancelled) and nothing that
// was not delivered is committed.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return fmt.Errorf("sink %q: runner already running", r.cfg.Name)
	}
	defer r.running.Store(false)

	committed, err := r.cur.Load()
	if err != nil {
		return fmt.Errorf("sink %q: load cursor: %w", r.cfg.Name, err)
	}
	committed = r.checkCursorBeyondLog(committed)
	r.mu.Lock()
	r.st.Cursor, r.st.Handled = committed, committed
	r.mu.Unlock()
	r.observeHead(committed)
	r.lastCommit = time.Now()
	r.log.Info("sink runner started", "cursor", committed)
	defer r.log.Info("sink runner stopped")
	// A clean stop commits what was handled since the last commit (never
	// the batch whose push was abandoned).
	defer r.commitOnStop()

	maxRecords := r.cfg.Batch.MaxRecords
	batch := make([]Record, 0, maxRecords)
	next := committed + 1
	var first time.Time // when the batch's first record was read
	readBackoff := r.cfg.Retry.Initial

	for {
		if ctx.Err() != nil {
			return nil
		}
		recs, skipped, err := r.src.Read(ctx, next, maxRecords-len(batch))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.setError(fmt.Errorf("read log at %d: %w", next, err))
			r.log.Warn("sink read failed", "from", next, "err", err, "retry_in", readBackoff)
			if r.sleep(ctx, readBackoff) != nil {
				return nil
			}
			readBackoff = r.nextBackoff(readBackoff)
			continue
		}
		readBackoff = r.cfg.Retry.Initial
		if skipped > 0 {
			r.countLost(next, skipped)
		}
		if len(recs) == 0 {
			next += skipped
		}

		f := r.filter.Load()
		var filtered uint64
		for _, rec := range recs {
			if rec.Offset < next {
				r.log.Error("sink source returned an offset out of order; record ignored", "offset", rec.Offset, "expected_from", next)
				continue
			}
			next = rec.Offset + 1
			if !f.match(rec.Occurrence) {
				filtered++
				continue
			}
			if len(batch) == 0 {
				first = time.Now()
				r.setOldest(rec)
			}
			batch = append(batch, rec)
		}
		if filtered > 0 {
			r.m.filtered.Add(float64(filtered))
			r.mu.Lock()
			r.st.Filtered += filtered
			r.mu.Unlock()
		}
		r.observeHead(next - 1)

		if len(batch) >= maxRecords || (len(batch) > 0 && time.Since(first) >= r.cfg.Batch.MaxWait) {
			if err := r.deliver(ctx, batch, next); err != nil {
				return nil // ctx ended: nothing undelivered is committed
			}
			clear(batch)
			batch = batch[:0]
			first = time.Time{}
			r.setOldest(Record{})
			r.setHandled(next - 1)
			if r.commitDue(true, next-1) {
				if err := r.commit(ctx, next-1); err != nil {
					return nil
				}
			}
			continue
		}
		if len(batch) == 0 {
			r.setHandled(next - 1)
		}
		if len(recs) > 0 || skipped > 0 {
			// More may be waiting; commit progress made only of filtered or
			// lost records too, so the lag stays true.
			if len(batch) == 0 && r.commitDue(false, next-1) {
				if err := r.commit(ctx, next-1); err != nil {
					return nil
				}
			}
			continue
		}
		// Caught up with the log: commit what was handled, now or, when the
		// last commit is more recent than commit_interval, once that much
		// time has passed without new records. A runner following a live
		// log catches up after every append: committing each time would
		// cost one fsync per append.
		var commitBy time.Time
		if len(batch) == 0 && next-1 > r.cursor() {
			if r.cfg.CommitInterval <= 0 || time.Since(r.lastCommit) >= r.cfg.CommitInterval {
				if err := r.commit(ctx, next-1); err != nil {
					return nil
				}
			} else {
				commitBy = r.lastCommit.Add(r.cfg.CommitInterval)
			}
		}
		r.detectLoss(next)
		wctx, cancel := ctx, context.CancelFunc(func() {})
		switch {
		case len(batch) > 0:
			wctx, cancel = context.WithDeadline(ctx, first.Add(r.cfg.Batch.MaxWait))
		case !commitBy.IsZero():
			wctx, cancel = context.WithDeadline(ctx, commitBy)
		}
		err = r.src.Wait(wctx, next-1)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			r.setError(fmt.Errorf("wait for log after %d: %w", next-1, err))
			r.log.Warn("sink wait failed", "after", next-1, "err", err)
			if r.sleep(ctx, r.cfg.Retry.Initial) != nil {
				return nil
			}
		}
	}
}

// deliver pushes batch until the push ends (delivered or refused for good).
// It returns an error only when ctx ended first. next is the offset the
// runner reads after the batch: while the push is retried, records from
// there on that retention removes are counted lost right away.
func (r *Runner) deliver(ctx context.Context, batch []Record, next uint64) error {
	backoff := r.cfg.Retry.Initial
	r.m.batchRecords.Observe(float64(len(batch)))
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.Retry.PushTimeout)
		start := time.Now()
		err := r.p.Push(pctx, batch)
		cancel()
		r.m.pushDuration.Observe(time.Since(start).Seconds())
		if err == nil {
			r.countSent(len(batch))
			r.setError(nil)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var partial *PartialError
		var throttle *ThrottleError
		var wait time.Duration
		class := ClassRetryable
		switch {
		case errors.As(err, &partial):
			r.dropPartial(batch, partial)
			return nil
		case IsPermanent(err):
			r.m.errPerm.Inc()
			r.dropAll(batch, err)
			r.setError(err)
			return nil
		case errors.As(err, &throttle):
			class = ClassThrottle
			r.m.errThrottle.Inc()
			wait = throttle.RetryAfter
			if wait <= 0 {
				wait = r.jitter(backoff)
			}
		default:
			r.m.errRetryable.Inc()
			wait = r.jitter(backoff)
		}
		r.setError(err)
		r.observeHead(0)
		r.detectLoss(next)
		r.log.Warn("sink push failed; retrying", "class", class, "attempt", attempt, "records", len(batch),
			"first_offset", batch[0].Offset, "retry_in", wait, "err", err)
		if err := r.sleep(ctx, wait); err != nil {
			return err
		}
		backoff = r.nextBackoff(backoff)
	}
}

func (r *Runner) nextBackoff(d time.Duration) time.Duration {
	n := time.Duration(float64(d) * r.cfg.Retry.Multiplier)
	if n > r.cfg.Retry.Max || n <= 0 {
		n = r.cfg.Retry.Max
	}
	return n
}

func (r *Runner) jitter(d time.Duration) time.Duration {
	j := r.cfg.Retry.Jitter
	if j == 0 {
		return d
	}
	f := 1 + j*(2*rand.Float64()-1)
	return time.Duration(float64(d) * f)
}

func eventID(rec Record) string {
	if rec.Occurrence == nil {
		return ""
	}
	return rec.Occurrence.GetEventId()
}

func (r *Runner) dropAll(batch []Record, err error) {
	for _, rec := range batch {
		r.log.Error("sink dropped a record: refused permanently", "offset", rec.Offset, "event_id", eventID(rec), "reason", err.Error())
	}
	r.m.failedPermanent.Add(float64(len(batch)))
	r.mu.Lock()
	r.st.Failed += uint64(len(batch))
	r.mu.Unlock()
}

func (r *Runner) dropPartial(batch []Record, pe *PartialError) {
	var dropped int
	for i := range batch {
		reason, ok := pe.Failed[i]
		if !ok {
			continue
		}
		dropped++
		msg := "refused"
		if reason != nil {
			msg = reason.Error()
		}
		r.log.Error("sink dropped a record: refused permanently", "offset", batch[i].Offset, "event_id", eventID(batch[i]), "reason", msg)
	}
	for i := range pe.Failed {
		if i < 0 || i >= len(batch) {
			r.log.Error("sink pusher reported a refused index outside the batch; ignored", "index", i, "records", len(batch))
		}
	}
	r.m.failedPartial.Add(float64(dropped))
	r.countSent(len(batch) - dropped)
	r.mu.Lock()
	r.st.Failed += uint64(dropped)
	r.mu.Unlock()
	if dropped > 0 {
		r.setError(pe)
	} else {
		r.setError(nil)
	}
}

func (r *Runner) countSent(n int) {
	r.m.sent.Add(float64(n))
	r.mu.Lock()
	r.st.Sent += uint64(n)
	r.mu.Unlock()
}

// countLost counts records [from, from+n) removed by retention before the
// runner read them, once each, and tells a LossCursor.
func (r *Runner) countLost(from, n uint64) {
	to := from + n - 1
	r.mu.Lock()
	if to <= r.lostThrough {
		r.mu.Unlock()
		return
	}
	from = max(from, r.lostThrough+1)
	n = to - from + 1
	r.lostThrough = to
	r.st.Lost += n
	r.mu.Unlock()
	r.log.Error("sink lost records: removed by retention before being delivered",
		"from_offset", from, "to_offset", to, "records", n)
	r.m.lost.Add(float64(n))
	if lc, ok := r.cur.(LossCursor); ok {
		lc.Lost(from, n)
	}
}

// detectLoss counts as lost, as soon as retention removed them, the records
// from next (the runner's next read) up to the log's first retained offset:
// a runner stuck retrying a push, or waiting, says so now rather than when
// its next read reaches them. Run's goroutine only.
func (r *Runner) detectLoss(next uint64) {
	b, ok := r.src.(sourceBounds)
	if !ok {
		return
	}
	if first, _ := b.Bounds(); first > next {
		r.countLost(next, first-next)
	}
}

// checkCursorBeyondLog reports a committed cursor beyond the end of the
// log (the log lost records, or is another one) and resumes from the log's
// end: new records then get offsets at or below the old cursor, and
// resuming from it would skip them silently.
func (r *Runner) checkCursorBeyondLog(committed uint64) uint64 {
	var last uint64
	// Bounds first: its last covers offsets assigned but holding no record
	// (skipped by a repair), which a cursor may well have passed.
	switch h := r.src.(type) {
	case sourceBounds:
		_, last = h.Bounds()
	case SourceHead:
		last = h.LastOffset()
	default:
		return committed
	}
	if committed <= last {
		return committed
	}
	err := fmt.Errorf("committed cursor %d is beyond the end of the log (%d): records the sink delivered are gone from the log, or the log was replaced; resuming after %d so that no new record is skipped",
		committed, last, last)
	r.log.Error("sink cursor beyond the end of the log", "cursor", committed, "log_last", last, "resume_after", last)
	r.m.cursorAhead.Inc()
	r.setError(err)
	return last
}

func (r *Runner) setError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.st.LastError = ""
	} else {
		r.st.LastError = err.Error()
	}
}

func (r *Runner) cursor() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Cursor
}

// setOldest records the age reference of the oldest undelivered record
// (rec zero: none).
func (r *Runner) setOldest(rec Record) {
	var t time.Time
	if o := rec.Occurrence; o != nil {
		switch {
		case o.GetObservedAt() != nil:
			t = o.GetObservedAt().AsTime()
		case o.GetOccurredAt() != nil:
			t = o.GetOccurredAt().AsTime()
		}
	}
	if t.IsZero() && rec.Offset != 0 {
		t = time.Now()
	}
	r.mu.Lock()
	r.oldest = t
	r.mu.Unlock()
	if t.IsZero() {
		r.m.lagSeconds.Set(0)
	} else {
		r.m.lagSeconds.Set(time.Since(t).Seconds())
	}
}

// sourceBounds is the same knowledge in the shape collector/store gives
// it.
type sourceBounds interface {
	Bounds() (first, last uint64)
}

func (r *Runner) observeHead(seen uint64) {
	switch h := r.src.(type) {
	case SourceHead:
		seen = max(seen, h.LastOffset())
	case sourceBounds:
		_, last := h.Bounds()
		seen = max(seen, last)
	}
	r.mu.Lock()
	if seen > r.st.LastOffset {
		r.st.LastOffset = seen
	}
	r.updateLagLocked()
	r.mu.Unlock()
}

func (r *Runner) updateLagLocked() {
	var lag uint64
	if h := max(r.st.Handled, r.st.Cursor); r.st.LastOffset > h {
		lag = r.st.LastOffset - h
	}
	r.st.LagRecords = lag
	r.m.lagRecords.Set(float64(lag))
	if !r.oldest.IsZero() {
		r.m.lagSeconds.Set(time.Since(r.oldest).Seconds())
	}
}

// setHandled records that every record up to off is handled, and tells a
// ProgressCursor.
func (r *Runner) setHandled(off uint64) {
	r.mu.Lock()
	r.handledLocked(off)
	r.mu.Unlock()
	if pc, ok := r.cur.(ProgressCursor); ok {
		pc.Handled(off)
	}
}

// handledLocked moves Handled (and LastOffset) up to off. r.mu is held.
func (r *Runner) handledLocked(off uint64) {
	r.st.Handled = max(r.st.Handled, off)
	r.st.LastOffset = max(r.st.LastOffset, off)
	r.updateLagLocked()
}

// commitDue says whether progress up to off is committed now, while
// records keep flowing. With commit_interval 0 that is after every push,
// and after a batch's worth of filtered or lost records; otherwise at most
// once per commit_interval. (Catching up and stopping always commit.)
func (r *Runner) commitDue(pushed bool, off uint64) bool {
	cur := r.cursor()
	if off <= cur {
		return false
	}
	if r.cfg.CommitInterval <= 0 {
		return pushed || off-cur >= uint64(r.cfg.Batch.MaxRecords)
	}
	return time.Since(r.lastCommit) >= r.cfg.CommitInterval
}

// Retire zeroes the runner's lag gauges once Run has returned, for a
// runner whose records another runner now delivers (in the collector's
// Kafka mode, a partition that moved to another replica): the lag is no
// longer this process's to report, and a frozen value would keep an alert
// firing on a replica that holds nothing.
func (r *Runner) Retire() {
	r.m.lagRecords.Set(0)
	r.m.lagSeconds.Set(0)
}

// commitOnStop commits, once and without retrying (the runner is
// stopping), what was handled after the last commit.
func (r *Runner) commitOnStop() {
	r.mu.Lock()
	off, cur := r.st.Handled, r.st.Cursor
	r.mu.Unlock()
	if off <= cur {
		return
	}
	if err := r.cur.Commit(off); err != nil {
		r.setError(fmt.Errorf("commit cursor %d on stop: %w", off, err))
		r.log.Warn("sink cursor not committed on stop; the records after it are delivered again after a restart",
			"cursor", cur, "handled", off, "err", err)
		return
	}
	r.committed(off)
}

func (r *Runner) committed(off uint64) {
	r.lastCommit = time.Now()
	r.mu.Lock()
	r.st.Cursor = off
	r.handledLocked(off)
	r.mu.Unlock()
	r.m.commits.Inc()
}

// commit persists off, retrying until it succeeds or ctx ends.
func (r *Runner) commit(ctx context.Context, off uint64) error {
	backoff := r.cfg.Retry.Initial
	for {
		err := r.cur.Commit(off)
		if err == nil {
			r.committed(off)
			return nil
		}
		r.setError(fmt.Errorf("commit cursor %d: %w", off, err))
		r.log.Error("sink cursor commit failed; retrying", "offset", off, "err", err, "retry_in", backoff)
		if err := r.sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = r.nextBackoff(backoff)
	}
}

package backbone

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eventpipe/eventpipe/sinks"
)

// GroupSink is one of the collector's sinks in Kafka mode: the same
// Pusher and RunnerConfig as in local mode.
type GroupSink struct {
	// Runner is the sink's shared-layer configuration. Runner.Name names
	// the sink, its consumer group (<group_prefix>.sink.<name>) and the
	// sink label of its metrics.
	Runner sinks.RunnerConfig
	Pusher sinks.Pusher
}

// GroupSinks runs every sink of a collector in Kafka mode as a member of
// one consumer group per sink, so the backbone's partitions are shared
// between the collector replicas and each record is delivered by one of
// them.
//
// For each partition the group assigns to this replica, a sinks.Runner
// (the same retry, backoff, batching, drop accounting and metrics as in
// local mode) reads the partition through a Reader (decoded records,
// duplicates removed by the dedupe window, seeded before the start) and
// commits the group's offset through a Cursor only after the sink
// acknowledged: the committed offset is the one after the last record
// handled (delivered, refused for good and counted, or filtered).
//
// Offsets: a sinks.Record's Offset is the Kafka offset plus one (sinks
// count offsets from 1 and a cursor of 0 means "nothing yet"), so the
// runner's cursor value is exactly the Kafka offset to commit.
//
// Rebalance: on revoke, the partition's runner is stopped (its in-flight
// push abandoned, nothing undelivered committed), what it handled is
// committed, and only then is the partition released. On a lost partition
// (the member was fenced) nothing is committed. The new owner starts at
// the committed offset with its window seeded from the records before it,
// so the hand-over neither loses nor repeats more than the records pushed
// but not yet committed (at most commit_interval's worth; they carry
// event_id).
//
// A sink group with no commit yet starts at the beginning of the topic
// (what retention kept): nothing ingested is skipped.
type GroupSinks struct {
	cfg     Config
	opts    []kgo.Opt
	members []*member
	logger  *slog.Logger
	running atomic.Bool
}

// NewGroupSinks checks cfg and the sinks and builds the members; nothing
// is contacted before Run. logger and reg may be nil.
//
// The integrator (collector.New in Kafka mode) builds each sink's Pusher
// as in local mode and runs GroupSinks.Run in the collector's group in
// place of the local sink runners; Status feeds /readyz detail and logs.
func NewGroupSinks(cfg Config, list []GroupSink, logger *slog.Logger, reg prometheus.Registerer) (*GroupSinks, error) {
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	seen := map[string]bool{}
	for i, s := range list {
		if err := s.Runner.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("sinks[%d]: %w", i, err))
		}
		if s.Pusher == nil {
			errs = append(errs, fmt.Errorf("sinks[%d] (%s): no pusher", i, s.Runner.Name))
		}
		if seen[s.Runner.Name] {
			errs = append(errs, fmt.Errorf("sinks[%d]: duplicate name %q", i, s.Runner.Name))
		}
		seen[s.Runner.Name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("group sinks: %w", err)
	}
	opts, err := cfg.ClientOptions()
	if err != nil {
		return nil, fmt.Errorf("group sinks: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := NewReadMetrics(reg)
	if err != nil {
		return nil, err
	}
	gm, err := newGroupMetrics(reg)
	if err != nil {
		return nil, err
	}
	g := &GroupSinks{cfg: cfg, opts: opts, logger: logger}
	for _, s := range list {
		consumer := SinkConsumer(s.Runner.Name)
		g.members = append(g.members, &member{
			g: g, sink: s, consumer: consumer, group: cfg.GroupName(consumer),
			log: logger.With("sink", s.Runner.Name, "group", cfg.GroupName(consumer)),
			reg: reg, m: m, gm: gm.forSink(s.Runner.Name), parts: map[int32]*partWorker{},
		})
	}
	return g, nil
}

// Kinds of rebalance this replica's member of a sink group went through
// (the kind label of eventpipe_collector_backbone_sink_rebalances_total).
const (
	rebalanceAssigned = "assigned" // partitions given to this replica
	rebalanceRevoked  = "revoked"  // taken away after a final commit
	rebalanceLost     = "lost"     // taken away without one (fenced)
)

// groupMetrics tell which replica owns how much of each sink's group, and
// how often that changes: the sum of the assigned gauges over the replicas
// is the topic's partition count once a rebalance settled; a partition
// that nobody owns delivers nothing (its lag grows), and frequent
// rebalances repeat up to commit_interval's worth of records each time.
type groupMetrics struct {
	assigned   *prometheus.GaugeVec
	rebalances *prometheus.CounterVec
}

func newGroupMetrics(reg prometheus.Registerer) (*groupMetrics, error) {
	m := &groupMetrics{
		assigned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "eventpipe_collector_backbone_sink_assigned_partitions",
			Help: "Backbone topic partitions this replica owns in the sink's consumer group (summed over the replicas: the partition count, once a rebalance settled).",
		}, []string{"sink"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_sink_rebalances_total",
			Help: "Rebalances of the sink's consumer group that changed this replica's partitions: kind=assigned (given some), revoked (gave some up after committing what it handled), lost (fenced: gave some up without a commit, their new owner repeats what was handled since the last one).",
		}, []string{"sink", "kind"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	m.assigned = register(reg, m.assigned, &errs)
	m.rebalances = register(reg, m.rebalances, &errs)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register backbone sink group metrics: %w", err)
	}
	return m, nil
}

// sinkGroupMetrics are groupMetrics curried with one sink's label; every
// series exists from the start (0), so a rate or an absent owner shows.
type sinkGroupMetrics struct {
	assigned                     prometheus.Gauge
	assignments, revokes, losses prometheus.Counter
}

func (m *groupMetrics) forSink(sink string) sinkGroupMetrics {
	return sinkGroupMetrics{
		assigned:    m.assigned.WithLabelValues(sink),
		assignments: m.rebalances.WithLabelValues(sink, rebalanceAssigned),
		revokes:     m.rebalances.WithLabelValues(sink, rebalanceRevoked),
		losses:      m.rebalances.WithLabelValues(sink, rebalanceLost),
	}
}

// Run joins every sink's group and delivers until ctx ends; then it stops
// every partition runner, commits what they handled, and leaves the groups
// (the partitions move to the other replicas at once, not after a session
// timeout). It returns nil after a clean stop.
func (g *GroupSinks) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return errors.New("group sinks already running")
	}
	defer g.running.Store(false)
	var wg sync.WaitGroup
	errs := make([]error, len(g.members))
	for i, m := range g.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.run(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// PartitionStatus is one assigned partition's runner.
type PartitionStatus struct {
	Partition int32
	// Starting is true while the partition's start offset is being
	// resolved (before its runner exists).
	Starting bool
	Runner   sinks.Status
}

// SinkStatus is one sink's membership on this replica.
type SinkStatus struct {
	Name, Group string
	// Partitions assigned to this replica now, by partition.
	Partitions []PartitionStatus
	// Revoked and Lost count partitions handed over since the start
	// (Lost: taken away without a final commit).
	Revoked, Lost uint64
}

// Status returns a snapshot per sink.
func (g *GroupSinks) Status() []SinkStatus {
	out := make([]SinkStatus, 0, len(g.members))
	for _, m := range g.members {
		out = append(out, m.status())
	}
	return out
}

// member is one sink's consumer group membership on this replica.
type member struct {
	g        *GroupSinks
	sink     GroupSink
	consumer string
	group    string
	log      *slog.Logger
	reg      prometheus.Registerer
	m        *ReadMetrics
	gm       sinkGroupMetrics
	extra    []kgo.Opt // tests: shorter session timeouts

	mu       sync.Mutex
	runCtx   context.Context
	parts    map[int32]*partWorker
	revoked  uint64
	lost     uint64
	stopping bool
}

type partWorker struct {
	p      int32
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	runner *sinks.Runner
	cursor *partCursor
}

func (m *member) status() SinkStatus {
	m.mu.Lock()
	st := SinkStatus{Name: m.sink.Runner.Name, Group: m.group, Revoked: m.revoked, Lost: m.lost}
	ws := make([]*partWorker, 0, len(m.parts))
	for _, w := range m.parts {
		ws = append(ws, w)
	}
	m.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		ps := PartitionStatus{Partition: w.p, Starting: w.runner == nil}
		if w.runner != nil {
			ps.Runner = w.runner.Status()
		}
		w.mu.Unlock()
		st.Partitions = append(st.Partitions, ps)
	}
	slices.SortFunc(st.Partitions, func(a, b PartitionStatus) int { return int(a.Partition - b.Partition) })
	return st
}

// stopGrace bounds the final commits when the collector stops.
const stopGrace = 10 * time.Second

func (m *member) run(ctx context.Context) error {
	m.mu.Lock()
	m.runCtx = ctx
	m.mu.Unlock()
	topic := m.g.cfg.Topic
	opts := append(slices.Clip(m.g.opts),
		kgo.ConsumerGroup(m.group),
		kgo.SessionTimeout(m.g.cfg.SessionTimeout),
		kgo.HeartbeatInterval(m.g.cfg.SessionTimeout/3),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(m.assigned),
		kgo.OnPartitionsRevoked(m.revoke),
		kgo.OnPartitionsLost(m.lose),
	)
	opts = append(opts, m.extra...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("sink %s: consumer group client: %w", m.sink.Runner.Name, err)
	}
	// The group client only takes part in the group and commits: each
	// partition's runner reads through its own Reader, from the offset the
	// group committed, so this client never fetches.
	cl.PauseFetchTopics(topic)
	m.log.Info("sink joining its consumer group", "topic", topic)
	<-ctx.Done()

	m.mu.Lock()
	m.stopping = true
	parts := m.takeAll()
	m.mu.Unlock()
	gctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	m.stopAndCommit(gctx, cl, parts)
	cancel()
	cl.Close() // leaves the group: the partitions move on at once
	m.log.Info("sink left its consumer group")
	return nil
}

// takeAll removes every worker (m.mu held).
func (m *member) takeAll() []*partWorker {
	ws := make([]*partWorker, 0, len(m.parts))
	for p, w := range m.parts {
		ws = append(ws, w)
		delete(m.parts, p)
	}
	m.gm.assigned.Set(0)
	return ws
}

// take removes the workers of parts: from then on they are not this
// replica's. The assigned gauge drops before their final commit, and the
// group gives them to another member only after this one's revoke, so the
// gauges of two replicas count a partition twice only while a fenced
// member has not yet been told (lost).
func (m *member) take(parts []int32) []*partWorker {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ws []*partWorker
	for _, p := range parts {
		if w := m.parts[p]; w != nil {
			ws = append(ws, w)
			delete(m.parts, p)
		}
	}
	m.gm.assigned.Set(float64(len(m.parts)))
	return ws
}

// assigned starts a runner per new partition. The start offset is
// resolved by the worker itself (with retries), not here: a callback that
// blocks delays the whole group's rebalance.
func (m *member) assigned(_ context.Context, cl *kgo.Client, a map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopping || m.runCtx == nil || m.runCtx.Err() != nil {
		return
	}
	added := 0
	for _, p := range a[m.g.cfg.Topic] {
		if m.parts[p] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(m.runCtx)
		w := &partWorker{p: p, cancel: cancel, done: make(chan struct{})}
		m.parts[p] = w
		added++
		go m.work(ctx, cl, w)
	}
	m.gm.assigned.Set(float64(len(m.parts)))
	if added > 0 {
		m.gm.assignments.Inc()
	}
	m.log.Info("sink partitions assigned", "partitions", a[m.g.cfg.Topic])
}

// revoke stops the revoked partitions' runners and commits what they
// handled before the partitions are released.
func (m *member) revoke(ctx context.Context, cl *kgo.Client, r map[string][]int32) {
	ws := m.take(r[m.g.cfg.Topic])
	if len(ws) == 0 {
		return
	}
	m.stopAndCommit(ctx, cl, ws)
	m.mu.Lock()
	m.revoked += uint64(len(ws))
	m.mu.Unlock()
	m.gm.revokes.Inc()
	m.log.Info("sink partitions revoked; handled records committed", "partitions", r[m.g.cfg.Topic])
}

// lose stops the lost partitions' runners without committing: another
// member owns them already, a commit would be refused or, worse, move its
// offset.
func (m *member) lose(_ context.Context, _ *kgo.Client, l map[string][]int32) {
	ws := m.take(l[m.g.cfg.Topic])
	for _, w := range ws {
		w.cancel()
	}
	for _, w := range ws {
		<-w.done
	}
	m.mu.Lock()
	m.lost += uint64(len(ws))
	m.mu.Unlock()
	if len(ws) > 0 {
		m.gm.losses.Inc()
		m.log.Warn("sink partitions lost (the member was fenced from its group); records handled since the last commit will be delivered again by their new owner",
			"partitions", l[m.g.cfg.Topic])
	}
}

// stopAndCommit stops workers and commits the last offset each handled.
func (m *member) stopAndCommit(ctx context.Context, cl *kgo.Client, ws []*partWorker) {
	for _, w := range ws {
		w.cancel()
	}
	offs := map[int32]kgo.EpochOffset{}
	for _, w := range ws {
		<-w.done
		w.mu.Lock()
		c := w.cursor
		w.mu.Unlock()
		if c == nil {
			continue
		}
		if off, dirty := c.uncommitted(); dirty {
			offs[w.p] = kgo.EpochOffset{Epoch: -1, Offset: off}
		}
	}
	if len(offs) == 0 {
		return
	}
	if err := commit(ctx, cl, map[string]map[int32]kgo.EpochOffset{m.g.cfg.Topic: offs}); err != nil {
		m.log.Warn("sink final commit failed; the records handled since the last commit will be delivered again (they carry event_id)",
			"offsets", fmt.Sprint(offs), "err", err)
		return
	}
	for _, w := range ws {
		if c := w.cursor; c != nil {
			c.markCommitted()
		}
	}
}

// commit commits offs for the member's group generation and reports the
// first refusal.
func commit(ctx context.Context, cl *kgo.Client, offs map[string]map[int32]kgo.EpochOffset) error {
	var rerr error
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			rerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil && rerr == nil {
					rerr = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
				}
			}
		}
	})
	return rerr
}

// work runs one partition until its context ends.
func (m *member) work(ctx context.Context, cl *kgo.Client, w *partWorker) {
	defer close(w.done)
	log := m.log.With("partition", w.p)
	topic := m.g.cfg.Topic
	pusher := m.sink.Pusher
	var cur *partCursor
	var txn sinks.TxnPusher
	if tr, ok := pusher.(sinks.Transactor); ok && m.g.cfg.Transactions.Enabled {
		var err error
		txn, err = tr.Transactional(sinks.TxnSource{
			Group: m.group, Topic: topic, Partition: w.p,
			TransactionalID: fmt.Sprintf("%s.%s.%d", m.group, topic, w.p),
			Timeout:         m.g.cfg.Transactions.Timeout,
			Member:          cl.GroupMetadata,
			Committed:       func(off uint64) { cur.committedAt(off) },
		})
		if err != nil {
			log.Error("sink cannot build its transactional producer", "err", err)
			return
		}
		defer txn.Close()
		pusher = txn
	}
	var start, logStart, end int64
	backoff := 250 * time.Millisecond
	for {
		var err error
		// The partition's transactional producer fences the previous
		// owner (and aborts what it left open) before the committed
		// offset is read: an offset committed by a transaction the
		// previous owner had not finished is then either in or out, for
		// good.
		if txn != nil {
			err = txn.Init(ctx)
		}
		if err == nil {
			start, logStart, end, err = m.resolve(ctx, cl, w.p)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("sink cannot resolve its partition's start offset; retrying", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + time.Duration(rand.Int64N(int64(backoff/4)))):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	if start > end {
		log.Error("committed offset is beyond the end of the partition (the topic was recreated?); resuming at its end so that no new record is skipped",
			"committed", start, "end", end)
		start = end
	}
	var lost uint64
	if start < logStart {
		lost = uint64(logStart - start)
	}
	// The Reader starts where records still are; what retention removed
	// before is reported by the source's first Read (lost).
	r, err := NewReader(m.g.opts, topic, map[int32]int64{w.p: max(start, logStart)}, m.g.cfg.DedupeWindow, m.consumer, m.m, log)
	if err != nil {
		log.Error("sink cannot read its partition", "err", err)
		return
	}
	defer r.Close()
	src := &partSource{r: r, p: w.p, pendingLost: lost}
	src.head.Store(uint64(end))
	cur = &partCursor{ctx: ctx, cl: cl, topic: topic, p: w.p, loaded: uint64(start), done: uint64(start), committed: uint64(start)}
	reg := m.reg
	if reg != nil {
		// One runner per partition: the partition label keeps their lag
		// gauges apart (the counters add up per sink as in local mode).
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"partition": strconv.Itoa(int(w.p))}, reg)
	}
	runner, err := sinks.NewRunner(m.sink.Runner, pusher, src, cur, log, reg)
	if err != nil {
		log.Error("sink runner cannot start", "err", err)
		return
	}
	w.mu.Lock()
	w.runner, w.cursor = runner, cur
	w.mu.Unlock()
	log.Info("sink partition started", "start_offset", start, "log_start", logStart, "end", end, "transactional", txn != nil)
	if err := runner.Run(ctx); err != nil {
		log.Error("sink runner failed", "err", err)
	}
	runner.Retire()
}

// resolve returns where the partition starts for this group: the
// committed offset, or the log start when the group has none; and the
// partition's log start and end.
func (m *member) resolve(ctx context.Context, cl *kgo.Client, p int32) (start, logStart, end int64, err error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topic := m.g.cfg.Topic
	committed, err := CommittedOffsets(rctx, cl, m.group, topic)
	if err != nil {
		return 0, 0, 0, err
	}
	starts, err := ListOffsets(rctx, cl, topic, []int32{p}, true)
	if err != nil {
		return 0, 0, 0, err
	}
	ends, err := ListOffsets(rctx, cl, topic, []int32{p}, false)
	if err != nil {
		return 0, 0, 0, err
	}
	logStart, end = starts[p], ends[p]
	start, ok := committed[p]
	if !ok {
		start = logStart
	}
	return start, logStart, end, nil
}

// partSource is the sinks.Source of one partition: the Reader's records
// with Offset = Kafka offset + 1. Only its runner's goroutine calls Read
// and Wait.
type partSource struct {
	r           *Reader
	p           int32
	buf         []bufRecord
	pendingLost uint64 // records retention removed before the start, reported once
	head        atomic.Uint64
}

// bufRecord is a record read ahead, with the offsets retention removed
// just before it (Record.Skipped).
type bufRecord struct {
	sinks.Record
	skipped uint64
}

var _ sinks.SourceHead = (*partSource)(nil)

// Read returns buffered records with Offset >= from without blocking.
// skipped counts the offsets in [from, first returned) that retention
// removed before they were read: the runner counts and logs them as lost.
// A later record with a gap before it ends the slice, so its gap is
// reported by the next Read.
func (s *partSource) Read(_ context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	lost := s.pendingLost
	s.pendingLost = 0
	i := 0
	for i < len(s.buf) && s.buf[i].Offset < from {
		i++
	}
	s.buf = s.buf[i:]
	if len(s.buf) > 0 {
		lost += s.buf[0].skipped
		s.buf[0].skipped = 0
	}
	out := make([]sinks.Record, 0, min(max, len(s.buf)))
	for _, b := range s.buf {
		if len(out) == max || (len(out) > 0 && b.skipped > 0) {
			break
		}
		out = append(out, b.Record)
	}
	s.buf = s.buf[len(out):]
	return out, lost, nil
}

// Wait polls the partition until a record after after is buffered.
func (s *partSource) Wait(ctx context.Context, after uint64) error {
	for {
		for _, r := range s.buf {
			if r.Offset > after {
				return nil
			}
		}
		recs, err := s.r.Poll(ctx)
		if err != nil {
			return err
		}
		for _, r := range recs {
			s.buf = append(s.buf, bufRecord{Record: sinks.Record{Offset: uint64(r.Offset) + 1, Occurrence: r.Occurrence}, skipped: uint64(r.Skipped)})
		}
		if hw := s.r.HighWatermark(s.p); hw > 0 {
			s.head.Store(max(s.head.Load(), uint64(hw)))
		}
	}
}

// LastOffset is the partition's high watermark in runner offsets (the
// last record's Kafka offset + 1), for the runner's lag.
func (s *partSource) LastOffset() uint64 { return s.head.Load() }

// partCursor commits one partition's group offset. Load is the offset the
// partition started at; Commit(o) commits Kafka offset o (the runner's
// "last handled" o is Kafka offset o-1). Once the partition's context has
// ended (revoke, shutdown) Commit only remembers o: the revoke callback
// commits it before the partition is released.
type partCursor struct {
	ctx   context.Context
	cl    *kgo.Client
	topic string
	p     int32

	loaded uint64

	mu        sync.Mutex
	done      uint64 // highest offset the runner asked to commit
	committed uint64 // highest offset committed
}

func (c *partCursor) Load() (uint64, error) { return c.loaded, nil }

func (c *partCursor) Commit(off uint64) error {
	c.mu.Lock()
	c.done = max(c.done, off)
	inTxn := off <= c.committed
	c.mu.Unlock()
	if inTxn {
		return nil // committed with the batch's transaction
	}
	if c.ctx.Err() != nil {
		return nil // the revoke or stop commits it
	}
	err := commit(c.ctx, c.cl, map[string]map[int32]kgo.EpochOffset{c.topic: {c.p: {Epoch: -1, Offset: int64(off)}}})
	if err != nil {
		if c.ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.mu.Lock()
	c.committed = max(c.committed, off)
	c.mu.Unlock()
	return nil
}

// uncommitted is the offset to commit on revoke, and whether it moves the
// group's offset.
func (c *partCursor) uncommitted() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.done), c.done > c.committed
}

// committedAt records an offset a transactional push committed with its
// batch.
func (c *partCursor) committedAt(off uint64) {
	c.mu.Lock()
	c.committed = max(c.committed, off)
	c.mu.Unlock()
}

func (c *partCursor) markCommitted() {
	c.mu.Lock()
	c.committed = max(c.committed, c.done)
	c.mu.Unlock()
}

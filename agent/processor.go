package agent

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// processor is the single goroutine between the watch reader and the
// shipper: it decides what is an occurrence, enriches it, holds Events whose
// owner is not cached yet, batches, and computes the cursor each batch may
// advance the collector to.
type processor struct {
	cfg     Config
	in      *itemQueue
	caches  *caches
	enr     *enrich.Enricher
	shipper *shipper
	// checks carries the registry checks' occurrences: supervisor-image
	// checks and pull-failure updates (nil: verify off).
	checks <-chan *eventpipev1.Occurrence
	// verify upgrades pull failures with cached registry answers and
	// queues the others for a check (nil: verify.pull_failures off).
	verify *pullVerifier
	// context applies the cluster-context rules to pull failures (pullcontext.go).
	context *pullContext
	log     *slog.Logger
	m       *metrics
	now     func() time.Time

	seen    *fingerprints
	cursor  cursorTracker
	held    []*heldEvent
	lastTry time.Time

	batch      []*eventpipev1.Occurrence
	batchBytes int
	batchAt    time.Time
	sentRV     string
}

type heldEvent struct {
	ev       *enrich.Event
	p        *pending
	heldAt   time.Time
	observed time.Time
}

func newProcessor(cfg Config, in *itemQueue, c *caches, enr *enrich.Enricher, sh *shipper, startRV string, log *slog.Logger, m *metrics) *processor {
	return &processor{
		cfg: cfg, in: in, caches: c, enr: enr, shipper: sh, log: log, m: m, now: time.Now,
		seen:    newFingerprints(cfg.Watch.FingerprintCapacity),
		context: newPullContext(podPullSecrets(c)),
		cursor:  cursorTracker{safe: startRV},
		sentRV:  startRV,
	}
}

func (p *processor) run(ctx context.Context) error {
	flush := time.NewTicker(p.cfg.Ship.FlushInterval)
	defer flush.Stop()
	retry := time.NewTicker(p.cfg.Hold.RetryInterval)
	defer retry.Stop()
	gauges := time.NewTicker(5 * time.Second)
	defer gauges.Stop()
	// linger runs while an idle flush waits ship.idle_linger for more
	// occurrences to join the batch; lingerC is nil when it is not armed.
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	var lingerC <-chan time.Time
	idleFlush := func() bool {
		if !p.idleFlushDue() {
			return true
		}
		if p.cfg.Ship.IdleLinger <= 0 {
			return p.flush(ctx)
		}
		if lingerC == nil {
			linger.Reset(p.cfg.Ship.IdleLinger)
			lingerC = linger.C
		}
		return true
	}
	var changed <-chan struct{}
	var diagnose <-chan objKey
	var gone, conditions <-chan *enrich.Sandbox
	var ready <-chan readyChange
	if p.caches != nil {
		changed, diagnose, gone, conditions, ready = p.caches.changed, p.caches.diagnose, p.caches.gone, p.caches.conditions, p.caches.ready
		if !p.sweepReady(ctx) {
			return nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case chunk := <-p.in.ch:
			for _, it := range chunk {
				if !p.handle(ctx, it) {
					return nil
				}
			}
			p.in.done(chunk)
			p.m.queueLength.Set(float64(p.in.n.Load()))
			if !idleFlush() {
				return nil
			}
		case key := <-diagnose:
			if !p.diagnose(ctx, key) || !idleFlush() {
				return nil
			}
		case o := <-p.checks:
			if !p.add(ctx, o, sourceRegistryCheck) || !idleFlush() {
				return nil
			}
		case sb := <-gone:
			if o := p.enr.SandboxDeleted(sb, p.now()); o != nil {
				if !p.add(ctx, o, sourceDeletion) || !idleFlush() {
					return nil
				}
			}
		case rc := <-ready:
			if !p.containersReady(ctx, rc.old, rc.cur) || !idleFlush() {
				return nil
			}
		case sb := <-conditions:
			if o := p.enr.DiagnoseSandbox(sb, p.now()); o != nil {
				if !p.add(ctx, o, eventpipev1.PullSourceSandboxCondition) || !idleFlush() {
					return nil
				}
			}
		case <-lingerC:
			lingerC = nil
			if len(p.batch) > 0 && !p.flush(ctx) {
				return nil
			}
		case <-changed:
			if len(p.held) > 0 && p.now().Sub(p.lastTry) >= p.cfg.Hold.RetryInterval/4 {
				if !p.retryHeld(ctx) || !idleFlush() {
					return nil
				}
			}
		case <-retry.C:
			if len(p.held) > 0 {
				if !p.retryHeld(ctx) || !idleFlush() {
					return nil
				}
			}
		case <-flush.C:
			if len(p.batch) > 0 || p.cursor.safe != p.sentRV {
				if !p.flush(ctx) {
					return nil
				}
			}
		case <-gauges.C:
			if p.caches != nil {
				p.caches.updateGauges()
			}
		}
	}
}

// handle processes one watch item; false when ctx ended.
func (p *processor) handle(ctx context.Context, it item) bool {
	switch it.kind {
	case itemBookmark, itemListEnd:
		p.cursor.advance(it.rv)
		return true
	case itemDeleted:
		p.seen.forget(it.ev.UID)
		p.m.skipped.WithLabelValues("deleted").Inc()
		p.cursor.advance(it.rv)
		return true
	}
	if it.modified && !it.listed {
		if prev, ok := p.seen.get(it.ev.UID); ok && prev == it.fp {
			// No change of count, series or message: a no-op update or a
			// series heartbeat, not an occurrence.
			p.seen.put(it.ev.UID, it.fp)
			p.m.skipped.WithLabelValues("unchanged").Inc()
			p.cursor.advance(it.rv)
			return true
		}
	}
	p.seen.put(it.ev.UID, it.fp)
	res := p.enr.Enrich(it.ev, it.observed)
	if res.Missing && p.cfg.Hold.MaxAge > 0 && p.fresh(it) {
		if len(p.held) < p.cfg.Hold.MaxEvents {
			p.held = append(p.held, &heldEvent{ev: it.ev, p: p.cursor.add(it.rv), heldAt: p.now(), observed: it.observed})
			p.m.held.Set(float64(len(p.held)))
			return true
		}
		p.m.holdOverflow.Inc()
	}
	p.cursor.advance(it.rv)
	return p.add(ctx, res.Occurrence, eventpipev1.PullSourceEvent)
}

// fresh reports whether an Event occurred recently enough that its owner
// may still be on its way into the caches (the creation race).
func (p *processor) fresh(it item) bool {
	if p.cfg.Hold.FreshWithin <= 0 {
		return true
	}
	return it.observed.Sub(enrich.OccurrenceTime(it.ev, it.observed)) <= p.cfg.Hold.FreshWithin
}

// retryHeld re-enriches held Events: attributed ones and expired ones ship.
func (p *processor) retryHeld(ctx context.Context) bool {
	now := p.now()
	p.lastTry = now
	kept := p.held[:0]
	type shipping struct {
		p   *pending
		occ *eventpipev1.Occurrence
	}
	var ship []shipping
	for _, h := range p.held {
		res := p.enr.Enrich(h.ev, h.observed)
		switch {
		case !res.Missing:
			p.m.lateBound.Inc()
		case now.Sub(h.heldAt) >= p.cfg.Hold.MaxAge:
			p.m.holdExpired.Inc()
		default:
			kept = append(kept, h)
			continue
		}
		ship = append(ship, shipping{h.p, res.Occurrence})
	}
	for i := len(kept); i < len(p.held); i++ {
		p.held[i] = nil
	}
	p.held = kept
	p.m.held.Set(float64(len(p.held)))
	// Each item is marked done only as it goes into the batch: add may
	// flush, and the flushed batch's cursor must not pass an item that is
	// still waiting for a later batch (a crash between the two would skip
	// it on resume).
	for _, sh := range ship {
		p.cursor.done(sh.p)
		if !p.add(ctx, sh.occ, eventpipev1.PullSourceEvent) {
			return false
		}
	}
	return true
}

func (p *processor) diagnose(ctx context.Context, key objKey) bool {
	co, ok := p.caches.pods.store.get(key)
	if !ok || co.pod == nil {
		return true
	}
	for _, o := range p.enr.DiagnosePod(co.pod, p.now()) {
		if !p.add(ctx, o, eventpipev1.PullSourcePodStatus) {
			return false
		}
	}
	return true
}

// sweepReady writes the container readiness occurrences of the pods the
// caches listed before this term began: what an earlier term (or another
// replica) reported about them is unknown here, so a probe blocker that
// ended while no agent watched would otherwise stay open for readers. One
// occurrence per ready container with a readiness or startup probe of a
// sandbox's pod, once per term; its event_id is the pod version's, so the
// collector de-duplicates it against the one a term that saw the same
// version wrote. false when ctx ended.
func (p *processor) sweepReady(ctx context.Context) bool {
	pods := p.caches.pods.store.matching(func(c *cached) bool { return c.pod != nil && enrich.BecameReady(nil, c.pod) })
	for _, c := range pods {
		if !p.containersReady(ctx, nil, c.pod) {
			return false
		}
	}
	return true
}

// containersReady ships the container readiness occurrences of cur (see
// enrich.ContainersReady); false when ctx ended.
func (p *processor) containersReady(ctx context.Context, old, cur *enrich.Pod) bool {
	for _, o := range p.enr.ContainersReady(old, cur, p.now()) {
		if !p.add(ctx, o, sourceContainerReady) {
			return false
		}
	}
	return true
}

// podPullSecrets looks a cached pod's imagePullSecrets names up for the
// cluster-context rules (nil without caches).
func podPullSecrets(c *caches) func(namespace, name string) ([]string, bool) {
	if c == nil {
		return nil
	}
	return func(namespace, name string) ([]string, bool) {
		co, ok := c.pods.store.get(objKey{namespace, name})
		if !ok || co.pod == nil {
			return nil, false
		}
		return co.pod.PullSecrets, true
	}
}

// sourceDeletion is the occurrences metric's source label of deletion
// occurrences (enrich.SandboxDeleted).
const sourceDeletion = "deletion"

// sourceContainerReady is the source label of container readiness
// occurrences (enrich.ContainersReady).
const sourceContainerReady = "container_ready"

// sourceRegistryCheck is the source label of the occurrences registry
// checks make (verify: supervisor-image checks, pull-failure updates).
const sourceRegistryCheck = "registry_check"

// add appends one occurrence to the batch, shipping the batch when full.
func (p *processor) add(ctx context.Context, o *eventpipev1.Occurrence, source string) bool {
	p.m.occurrences.WithLabelValues(source).Inc()
	if p.context != nil && source != sourceRegistryCheck && p.context.apply(o, p.now()) {
		p.m.contextApplied.Inc()
	}
	if p.verify != nil && source != sourceRegistryCheck {
		p.verify.annotate(o)
	}
	if o.GetSandbox() != nil && o.GetAttribution() != eventpipev1.AttributionNone && o.GetAttribution() != "" {
		p.m.attributed.WithLabelValues(ruleLabel(o.GetAttribution())).Inc()
	} else {
		p.m.unattributed.Inc()
	}
	if len(p.batch) == 0 {
		p.batchAt = p.now()
	}
	p.batch = append(p.batch, o)
	p.batchBytes += proto.Size(o)
	if len(p.batch) >= p.cfg.Ship.BatchSize || p.batchBytes >= p.cfg.Ship.MaxBatchBytes {
		return p.flush(ctx)
	}
	return true
}

// idleFlushDue reports whether the batch should go out now rather than at
// the flush_interval tick (ship.flush_when_idle): nothing is waiting for an
// acknowledgement, so at a low event rate an occurrence waits for no timer
// but ship.idle_linger, and under load batches still fill while earlier
// ones are in flight (the way Nagle's algorithm batches).
func (p *processor) idleFlushDue() bool {
	return p.cfg.Ship.FlushWhenIdle && len(p.batch) > 0 && p.shipper != nil && p.shipper.idle()
}

// flush hands the batch (possibly empty: a cursor-only batch) to the
// shipper, blocking while too many batches are in flight.
func (p *processor) flush(ctx context.Context) bool {
	b := &eventpipev1.Batch{
		Cluster:         p.cfg.Cluster,
		Stream:          p.cfg.Collector.Stream,
		ResourceVersion: p.cursor.safe,
		Occurrences:     p.batch,
	}
	created := p.batchAt
	if len(p.batch) == 0 {
		created = p.now()
	}
	p.batch, p.batchBytes = nil, 0
	if err := p.shipper.submit(ctx, b, created); err != nil {
		return false
	}
	p.sentRV = b.ResourceVersion
	return true
}

// ---- cursor tracking ----

// pending is one watch item that has not been put in a batch yet (a held
// Event). Items are done in watch order except held ones.
type pending struct {
	rv   string
	done bool
}

// cursorTracker computes the low-water mark: the resourceVersion of the last
// item such that it and every item before it are in a batch. rv "" (listed
// Events) never moves the mark; the listing's end item does.
type cursorTracker struct {
	safe  string
	queue []*pending
	head  int
}

// add registers a not-yet-shipped item.
func (c *cursorTracker) add(rv string) *pending {
	p := &pending{rv: rv}
	c.queue = append(c.queue, p)
	return p
}

// advance records an item that is shipped (or is not an occurrence) at once.
func (c *cursorTracker) advance(rv string) {
	if c.head == len(c.queue) {
		if rv != "" {
			c.safe = rv
		}
		return
	}
	c.queue = append(c.queue, &pending{rv: rv, done: true})
}

// done marks a held item shipped and moves the mark past every leading done item.
func (c *cursorTracker) done(p *pending) {
	p.done = true
	for c.head < len(c.queue) && c.queue[c.head].done {
		if rv := c.queue[c.head].rv; rv != "" {
			c.safe = rv
		}
		c.queue[c.head] = nil
		c.head++
	}
	if c.head == len(c.queue) {
		c.queue, c.head = c.queue[:0], 0
	} else if c.head > 1024 && c.head > len(c.queue)/2 {
		n := copy(c.queue, c.queue[c.head:])
		clear(c.queue[n:])
		c.queue, c.head = c.queue[:n], 0
	}
}

// ---- fingerprints ----

// fingerprints is a bounded two-generation map from Event UID to the
// fingerprint of its last occurrence (count, series count, message).
//
// Keys are the UID's 16 bytes (API server UIDs are UUIDs) or, for a UID that
// is not one, a 128-bit hash of it: the maps then hold no pointers, so the
// garbage collector does not scan them, and an entry costs about 24 bytes
// instead of a string header, a 36-byte string and its allocation. A hash
// collision (2^-128) would at worst make an update look unchanged.
type fingerprints struct {
	cap        int
	young, old map[uidKey]uint64
}

type uidKey [16]byte

func newFingerprints(capacity int) *fingerprints {
	half := max(capacity/2, 1)
	return &fingerprints{cap: half, young: make(map[uidKey]uint64), old: map[uidKey]uint64{}}
}

// keyOf packs a UUID ("8-4-4-4-12" lower-case hex, as the API server writes
// them) into its 16 bytes, anything else into a 128-bit hash.
func keyOf(uid string) uidKey {
	var k uidKey
	if len(uid) == 36 && uid[8] == '-' && uid[13] == '-' && uid[18] == '-' && uid[23] == '-' {
		n := 0
		ok := true
		for i := 0; i < 36 && ok; i++ {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				continue
			}
			v, good := unhex(uid[i])
			ok = good
			if n%2 == 0 {
				k[n/2] = v << 4
			} else {
				k[n/2] |= v
			}
			n++
		}
		if ok {
			return k
		}
	}
	h := sha256.Sum256([]byte(uid))
	copy(k[:], h[:16])
	return k
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func (f *fingerprints) get(uid string) (uint64, bool) {
	k := keyOf(uid)
	if v, ok := f.young[k]; ok {
		return v, true
	}
	v, ok := f.old[k]
	return v, ok
}

func (f *fingerprints) put(uid string, fp uint64) {
	k := keyOf(uid)
	if _, ok := f.young[k]; !ok && len(f.young) >= f.cap {
		f.old, f.young = f.young, make(map[uidKey]uint64, f.cap/4)
	}
	f.young[k] = fp
	delete(f.old, k)
}

func (f *fingerprints) forget(uid string) {
	k := keyOf(uid)
	delete(f.young, k)
	delete(f.old, k)
}

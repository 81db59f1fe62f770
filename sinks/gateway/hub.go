package gateway

import (
	"container/list"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// entry is one spliced platform event, encoded once for every stream.
type entry struct {
	// cursor is the collector's Follow cursor; it counts within partition
	// (the backbone partition of a collector in Kafka mode, 0 in local
	// mode), so events are ordered by seq, their arrival order.
	cursor    uint64
	partition int32
	seq       uint64
	sandboxID string
	eventID   string
	msg       []byte // an encoded WatchSandboxesEvent
	// restored: read back at start with a cursor the previous run had
	// already delivered (see hub.restoreDelivered).
	restored bool
}

// sandbox is what the proxy keeps per live sandbox: the recent events (a
// ring of at most TailPerSandbox) and the patch its active blockers make
// (the blockers themselves are the hub's Folder's).
type sandbox struct {
	id   string
	tail []*entry
	// patch: nil while nothing blocks the sandbox.
	patch *blockerPatch
	lru   *list.Element
}

// blockerPatch is what every DriverSandbox of a blocked sandbox gets,
// computed once when an occurrence changes its blockers, not per answer.
type blockerPatch struct {
	p    driverwire.Patch
	pull bool // an ImagePulled condition is in it
	// until: a crash blocker in it may have settled from then on (the
	// container stayed up; diagnosis.Folder.Active), so it is computed
	// again; zero: it holds until the next occurrence.
	until time.Time
}

// gwConn is one gateway connection (a gateway process, until it or the
// proxy restarts). Its sent set is the per-stream dedupe: a WatchSandboxes
// stream reopened on the same connection gets only what was not yet sent.
type gwConn struct {
	id          uint64
	sent        map[string]struct{}
	order       []string // FIFO of sent ids, bounds sent to the window
	head        int
	skipRestore bool // the first connection after a restart: restored entries count as sent
	subs        int
	lru         *list.Element
}

// subscriber is one open WatchSandboxes stream. It reads the hub's log
// of recent events from its own position (next), so a slow stream never
// makes the hub wait or drop; only a stream more than MaxEvents behind
// loses its place (counted), and then catches up from the tails.
type subscriber struct {
	conn   *gwConn
	next   uint64        // the next log sequence number to send
	notify chan struct{} // signalled (capacity 1) when the log grew
}

// maxConns bounds the gateway connections remembered (one gateway process
// has one; old ones are forgotten first).
const maxConns = 16

// hub holds the proxy's state between the Follow stream and the gateway's
// streams. All methods are safe for concurrent use.
type hub struct {
	cfg FollowConfig
	m   *metrics

	mu        sync.RWMutex
	sandboxes map[string]*sandbox
	lru       *list.List // of *sandbox, most recently active at the front
	// folder keeps every live sandbox's blockers (pull failures and the
	// others) and decides when each ends: the same fold `eventpipe
	// diagnose` reads, bounded here by the hub (MaxSandboxes 0, Forget).
	folder          *diagnosis.Folder
	droppedBlockers int // folder.DroppedBlockers() already counted
	now             func() time.Time
	pulling         int // sandboxes with an ImagePulled condition
	blocked         int // sandboxes with any blocker condition
	conns           map[uint64]*gwConn
	connLRU         *list.List
	subs            map[*subscriber]struct{}
	restored        delivered // what the previous run delivered
	anyConn         bool      // a connection was seen since start
	events          int       // entries in all tails, at most cfg.MaxEvents
	// log is a ring of the last len(log) events in arrival order; event
	// number seq is at log[seq%len(log)], for seq in [logNext-logLen, logNext).
	log     []*entry
	logNext uint64
	logLen  int

	// following: eventpipe's Follow stream for this gateway is live (the
	// collector accepted the subscription and it has not failed since).
	following bool
}

func (h *hub) setFollowing(up bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.following = up
}

// replacing reports whether eventpipe's events stand in for the driver's
// own kubernetes events: only while the Follow stream is live. Before it
// first comes up, and from the moment it fails until it is live again, the
// driver's events pass unchanged (fail open: without the collector the
// gateway keeps the driver's view, from the first second of an outage).
func (h *hub) replacing() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.following
}

func newHub(cfg FollowConfig, m *metrics) *hub {
	folder := diagnosis.NewFolder()
	folder.MaxSandboxes = 0 // bounded by the hub: MaxSandboxes, Forget
	return &hub{
		cfg: cfg, m: m,
		sandboxes: map[string]*sandbox{}, lru: list.New(),
		folder: folder, now: time.Now,
		conns: map[uint64]*gwConn{}, connLRU: list.New(),
		subs: map[*subscriber]struct{}{},
		log:  make([]*entry, max(cfg.MaxEvents, 1)),
	}
}

func sandboxKey(id string) string { return strings.ToLower(id) }

// restoreDelivered records what the previous run delivered: entries read
// back at or below it are not sent again to the first gateway connection
// (the gateway that kept running while the proxy restarted already has
// them).
func (h *hub) restoreDelivered(d delivered) {
	h.mu.Lock()
	h.restored = d
	h.mu.Unlock()
}

// wasRestored reports whether the previous run delivered the event at
// cursor of partition.
func (h *hub) wasRestored(partition int32, cursor uint64) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.restored.covers(partition, cursor)
}

// delivered is how far the proxy has handed events to the gateway, per
// partition: the collector's cursors count within a backbone partition in
// Kafka mode (in local mode everything is partition 0, one cursor).
type delivered map[int32]uint64

func (d delivered) covers(partition int32, cursor uint64) bool {
	return cursor > 0 && cursor <= d[partition]
}

// advance returns d raised to the highest cursor per partition of es, and
// whether anything moved; d itself is not modified.
func (d delivered) advance(es []*entry) (delivered, bool) {
	var out delivered
	for _, e := range es {
		if e.cursor <= d[e.partition] || e.cursor <= out[e.partition] {
			continue
		}
		if out == nil {
			out = maps.Clone(d)
			if out == nil {
				out = delivered{}
			}
		}
		out[e.partition] = e.cursor
	}
	if out == nil {
		return d, false
	}
	return out, true
}

// get returns the sandbox's state, creating it (and evicting the least
// recently active one beyond MaxSandboxes). Called with h.mu held.
func (h *hub) get(id string) *sandbox {
	k := sandboxKey(id)
	if s, ok := h.sandboxes[k]; ok {
		h.lru.MoveToFront(s.lru)
		return s
	}
	s := &sandbox{id: id}
	s.lru = h.lru.PushFront(s)
	h.sandboxes[k] = s
	for h.lru.Len() > h.cfg.MaxSandboxes {
		old := h.lru.Back().Value.(*sandbox)
		h.drop(old)
		h.m.evicted.Inc()
	}
	h.m.sandboxes.Set(float64(len(h.sandboxes)))
	return s
}

func (h *hub) drop(s *sandbox) {
	h.setPatch(s, nil)
	h.folder.Forget(s.id)
	h.events -= len(s.tail)
	h.lru.Remove(s.lru)
	delete(h.sandboxes, sandboxKey(s.id))
	h.m.sandboxes.Set(float64(len(h.sandboxes)))
}

// forget drops a sandbox the driver reported deleted.
func (h *hub) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.sandboxes[sandboxKey(id)]; ok {
		h.drop(s)
	}
}

// apply takes one occurrence from the Follow stream: it updates the
// sandbox's blockers, keeps the event in the sandbox's tail and
// hands it to every open stream. restored marks occurrences the previous
// run already delivered.
func (h *hub) apply(cursor uint64, o *eventpipev1.Occurrence, restored bool) {
	h.applyAt(0, cursor, o, restored)
}

// applyAt is apply for an occurrence read from a partition of a collector
// in Kafka mode.
func (h *hub) applyAt(partition int32, cursor uint64, o *eventpipev1.Occurrence, restored bool) {
	id := o.GetSandbox().GetId()
	if id == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if o.GetSandbox().GetDeletedAt() != nil {
		// The sandbox is gone (its deletion, or a late Event of its old
		// pods): forget it and relay nothing. A sandbox created again under
		// its name has another id, so nothing of this one reaches it.
		if s, ok := h.sandboxes[sandboxKey(id)]; ok {
			h.drop(s)
		}
		return
	}
	s := h.get(id)
	h.fold(s, cursor, o)
	for _, e := range s.tail {
		if e.eventID == o.GetEventId() {
			h.m.duplicates.Inc() // the same occurrence stored twice (at-least-once ingest) or read again
			return
		}
	}
	e := &entry{cursor: cursor, partition: partition, seq: h.logNext, sandboxID: id, eventID: o.GetEventId(), restored: restored,
		msg: driverwire.AppendPlatformEvent(nil, id, platformEvent(o))}
	switch {
	case h.cfg.TailPerSandbox == 0:
	case len(s.tail) >= h.cfg.TailPerSandbox:
		copy(s.tail, s.tail[1:])
		s.tail[len(s.tail)-1] = e
	default:
		s.tail = append(s.tail, e)
		h.events++
		h.trim(s)
	}
	h.log[h.logNext%uint64(len(h.log))] = e
	h.logNext++
	h.logLen = min(h.logLen+1, len(h.log))
	for sub := range h.subs {
		select {
		case sub.notify <- struct{}{}:
		default:
		}
	}
}

// trim keeps the tails within MaxEvents by dropping the oldest events of
// the least recently active sandboxes (never of keep). Called with h.mu held.
func (h *hub) trim(keep *sandbox) {
	for el := h.lru.Back(); h.events > h.cfg.MaxEvents && el != nil; {
		s := el.Value.(*sandbox)
		if s == keep || len(s.tail) == 0 {
			el = el.Prev()
			continue
		}
		s.tail[0] = nil
		s.tail = s.tail[1:]
		h.events--
		h.m.trimmed.Inc()
	}
	h.m.events.Set(float64(h.events))
}

// fold hands the occurrence to the folder and, when the sandbox's blockers
// changed or it is blocked, computes its patch again. Called with h.mu held.
func (h *hub) fold(s *sandbox, cursor uint64, o *eventpipev1.Occurrence) {
	if o.GetSandbox().GetId() != s.id {
		// The same id in other letter case (the hub's key is lower case):
		// fold it under the spelling the sandbox was first seen with.
		o = proto.Clone(o).(*eventpipev1.Occurrence)
		o.Sandbox.Id = s.id
	}
	changed := h.folder.Add(cursor, o)
	if d := h.folder.DroppedBlockers(); d > h.droppedBlockers {
		h.m.blockersDropped.Add(float64(d - h.droppedBlockers))
		h.droppedBlockers = d
	}
	// A blocked sandbox's patch is computed again on every occurrence: a
	// Started changes nothing shown yet but starts a crash blocker's
	// settling (the patch's until).
	if changed || s.patch != nil {
		h.refresh(s)
	}
}

// refresh computes the sandbox's patch from its active blockers. Called
// with h.mu held.
func (h *hub) refresh(s *sandbox) {
	bs, until := h.folder.Active(s.id, h.now())
	bp := patchOf(bs)
	if bp != nil {
		bp.until = until
	}
	h.setPatch(s, bp)
}

// setPatch replaces the sandbox's patch and keeps the gauges. Called with
// h.mu held.
func (h *hub) setPatch(s *sandbox, bp *blockerPatch) {
	count := func(p *blockerPatch, sign int) {
		if p == nil {
			return
		}
		h.blocked += sign
		if p.pull {
			h.pulling += sign
		}
	}
	count(s.patch, -1)
	count(bp, 1)
	s.patch = bp
	h.m.failing.Set(float64(h.pulling))
	h.m.blocked.Set(float64(h.blocked))
}

// anyBlocked: some sandbox has a patch (the edit path's fast exit).
func (h *hub) anyBlocked() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.blocked > 0
}

// patchFor is the driverwire.PatchFunc of the proxy: the sandbox's
// conditions and Ready suffix while a blocker is active. It reads the patch
// computed when the blockers last changed; only once a crash blocker in it
// may have settled is it computed again.
func (h *hub) patchFor(id string) (driverwire.Patch, bool) {
	k := sandboxKey(id)
	h.mu.RLock()
	s, ok := h.sandboxes[k]
	var bp *blockerPatch
	if ok {
		bp = s.patch
	}
	h.mu.RUnlock()
	if bp == nil {
		return driverwire.Patch{}, false
	}
	if !bp.until.IsZero() && !h.now().Before(bp.until) {
		h.mu.Lock()
		if cur, ok := h.sandboxes[k]; ok && cur == s && s.patch == bp {
			h.refresh(s)
		}
		bp = s.patch
		h.mu.Unlock()
		if bp == nil {
			return driverwire.Patch{}, false
		}
	}
	return bp.p, true
}

// conn returns the state of a gateway connection. Called with h.mu held.
func (h *hub) conn(id uint64) *gwConn {
	if c, ok := h.conns[id]; ok {
		h.connLRU.MoveToFront(c.lru)
		return c
	}
	c := &gwConn{id: id, sent: map[string]struct{}{}, skipRestore: !h.anyConn && len(h.restored) > 0}
	h.anyConn = true
	c.lru = h.connLRU.PushFront(c)
	h.conns[id] = c
	for h.connLRU.Len() > maxConns {
		old := h.connLRU.Back().Value.(*gwConn)
		if old.subs > 0 {
			break
		}
		h.connLRU.Remove(old.lru)
		delete(h.conns, old.id)
	}
	return c
}

// subscribe registers a stream of connection connID and returns, in
// arrival order, the tail it must send first: the recent events of every
// live sandbox not yet sent on this connection.
func (h *hub) subscribe(connID uint64) (*subscriber, []*entry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.conn(connID)
	c.subs++
	sub := &subscriber{conn: c, next: h.logNext, notify: make(chan struct{}, 1)}
	h.subs[sub] = struct{}{}
	return sub, h.unsent(c)
}

// read returns up to max events from the subscriber's position in the log
// and advances it. overrun reports that events between its position and
// the oldest one kept were overwritten: the caller then catches up from
// the tails (pending).
func (h *hub) read(sub *subscriber, max int) (batch []*entry, overrun bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if oldest := h.logNext - uint64(h.logLen); sub.next < oldest {
		sub.next = oldest
		overrun = true
		h.m.lagged.Inc()
	}
	for ; sub.next < h.logNext && len(batch) < max; sub.next++ {
		batch = append(batch, h.log[sub.next%uint64(len(h.log))])
	}
	return batch, overrun
}

// pending is what the subscriber's connection has not been sent yet from
// the tails, in arrival order.
func (h *hub) pending(sub *subscriber) []*entry {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.unsent(sub.conn)
}

// unsent: called with h.mu held.
func (h *hub) unsent(c *gwConn) []*entry {
	var tail []*entry
	for _, s := range h.sandboxes {
		for _, e := range s.tail {
			if !h.wasSent(c, e) {
				tail = append(tail, e)
			}
		}
	}
	slices.SortFunc(tail, func(a, b *entry) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	return tail
}

func (h *hub) unsubscribe(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[sub]; ok {
		delete(h.subs, sub)
		sub.conn.subs--
	}
}

// wasSent reports whether e went out on c already. Called with h.mu held.
func (h *hub) wasSent(c *gwConn, e *entry) bool {
	if c.skipRestore && e.restored {
		return true
	}
	_, ok := c.sent[e.eventID]
	return ok
}

// claim marks e as sent on the subscriber's connection; false means it was
// sent already and must be skipped.
func (h *hub) claim(sub *subscriber, e *entry) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := sub.conn
	if h.wasSent(c, e) {
		h.m.duplicates.Inc()
		return false
	}
	c.sent[e.eventID] = struct{}{}
	if len(c.order) < h.cfg.DedupeWindow {
		c.order = append(c.order, e.eventID)
	} else {
		delete(c.sent, c.order[c.head])
		c.order[c.head] = e.eventID
		c.head = (c.head + 1) % len(c.order)
	}
	return true
}

// unclaim undoes claim for an event whose send failed.
func (h *hub) unclaim(sub *subscriber, e *entry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(sub.conn.sent, e.eventID)
}

package backbone

import (
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/prometheus/client_golang/prometheus"
)

// Window remembers the event_ids of the last Size records of one partition
// so a consumer can drop a record whose event_id it has seen recently: the
// copy an agent sends again when the acknowledgement of its batch was lost
// in a collector failover (docs/kafka-consumers.md, "Dedupe window").
//
// Memory is bounded: a ring of Size ids and a set of the same ids, grown as
// ids arrive (an idle partition costs nothing). Ids are kept as 128-bit
// FNV-1a hashes (16 bytes instead of the id's 40-80): two different ids
// collide with a probability near 2^-128 per pair, far below any other
// cause of loss. When the ring is full the oldest id is forgotten (an
// eviction, counted); a resend arriving more than Size records after its
// original is then let through and the consumer is at-least-once for it,
// which is why the window's size must cover the worst resend (the default
// does, see the doc).
//
// A Window belongs to one goroutine (one partition's reader): it is not
// safe for concurrent use.
type Window struct {
	size    int
	ring    []idKey
	next    int // where the next id goes once the ring is full
	set     map[idKey]struct{}
	evicted uint64
}

type idKey [16]byte

func keyOf(id string) idKey {
	h := fnv.New128a()
	_, _ = h.Write([]byte(id))
	var k idKey
	h.Sum(k[:0])
	return k
}

// NewWindow returns a window of size ids (at least 1).
func NewWindow(size int) *Window {
	return &Window{size: max(size, 1), set: map[idKey]struct{}{}}
}

// Check reports whether id was seen within the window. A new id is
// remembered (possibly evicting the oldest); a duplicate is not remembered
// again, so a burst of copies does not push older ids out. An empty id is
// never a duplicate and is not remembered (records without one cannot be
// de-duplicated).
func (w *Window) Check(id string) (duplicate bool) {
	if id == "" {
		return false
	}
	k := keyOf(id)
	if _, ok := w.set[k]; ok {
		return true
	}
	w.add(k)
	return false
}

// Remember adds id without reporting: seeding the window with the records
// before the consumer's start offset. An id already remembered is not
// added twice.
func (w *Window) Remember(id string) {
	if id == "" {
		return
	}
	k := keyOf(id)
	if _, ok := w.set[k]; ok {
		return
	}
	w.add(k)
}

func (w *Window) add(k idKey) {
	if len(w.ring) < w.size {
		w.ring = append(w.ring, k)
		w.set[k] = struct{}{}
		return
	}
	delete(w.set, w.ring[w.next])
	w.evicted++
	w.ring[w.next] = k
	w.set[k] = struct{}{}
	w.next = (w.next + 1) % w.size
}

// Len is the number of ids remembered.
func (w *Window) Len() int { return len(w.set) }

// Size is the window's capacity.
func (w *Window) Size() int { return w.size }

// Evictions counts the ids forgotten to make room since the window was
// made.
func (w *Window) Evictions() uint64 { return w.evicted }

// Consumer label values of the read side's metrics: the sink's group part
// ("sink.<name>", a configured name) or ConsumerFollow. Fixed by
// configuration, never by data.
const ConsumerFollow = "follow"

// SinkConsumer is the consumer label (and group part) of the sink called
// name.
func SinkConsumer(name string) string { return "sink." + name }

// ReadMetrics are the read side's counters, shared by every consumer
// registered on one Registerer (vectors already registered there are
// reused, as sinks.Runner does).
type ReadMetrics struct {
	duplicates  *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	undecodable *prometheus.CounterVec
	seeded      *prometheus.CounterVec
	skipped     *prometheus.CounterVec
}

// NewReadMetrics builds and registers the counters; reg may be nil.
func NewReadMetrics(reg prometheus.Registerer) (*ReadMetrics, error) {
	m := &ReadMetrics{
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_duplicates_dropped_total",
			Help: "Backbone records dropped by a consumer because their event_id was seen within its dedupe window (resends after a collector failover).",
		}, []string{"consumer"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_dedupe_evictions_total",
			Help: "Event ids forgotten by a consumer's dedupe window to make room (a resend older than the window would no longer be recognised).",
		}, []string{"consumer"}),
		undecodable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_undecodable_records_total",
			Help: "Backbone records a consumer could not decode as an occurrence; each is logged and skipped.",
		}, []string{"consumer"}),
		seeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_dedupe_seeded_records_total",
			Help: "Records read back before a consumer's start offset to fill its dedupe window (after a start, restart or rebalance).",
		}, []string{"consumer"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "eventpipe_collector_backbone_skipped_records_total",
			Help: "Backbone offsets a consumer never read: removed by topic retention while it was behind (each range is logged; sinks also count them in eventpipe_sink_lost_records_total).",
		}, []string{"consumer"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	m.duplicates = register(reg, m.duplicates, &errs)
	m.evictions = register(reg, m.evictions, &errs)
	m.undecodable = register(reg, m.undecodable, &errs)
	m.seeded = register(reg, m.seeded, &errs)
	m.skipped = register(reg, m.skipped, &errs)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register backbone read metrics: %w", err)
	}
	return m, nil
}

// register registers c, or returns the collector of the same kind already
// registered under its name (several consumers share one registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errs *[]error) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		*errs = append(*errs, err)
	}
	return c
}

// consumerMetrics are ReadMetrics curried with one consumer's label.
type consumerMetrics struct {
	duplicates, evictions, undecodable, seeded, skipped prometheus.Counter
}

func (m *ReadMetrics) forConsumer(consumer string) consumerMetrics {
	if m == nil {
		m, _ = NewReadMetrics(nil)
	}
	return consumerMetrics{
		duplicates:  m.duplicates.WithLabelValues(consumer),
		evictions:   m.evictions.WithLabelValues(consumer),
		undecodable: m.undecodable.WithLabelValues(consumer),
		seeded:      m.seeded.WithLabelValues(consumer),
		skipped:     m.skipped.WithLabelValues(consumer),
	}
}

package agent

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Dead letters: occurrences the collector refused for good (or that cannot
// be encoded at all). Re-sending them cannot help, so the agent moves on;
// each one is counted (eventpipe_agent_dead_letter_total{reason}), logged
// at ERROR with its event_id, and kept in a bounded in-memory ring served
// as JSON lines at /debug/deadletter.
//
// Why memory and not a file: the agent runs as a stateless Deployment (no
// volume, its cursor lives at the collector), so a file would vanish with
// the pod anyway; the log line is the durable record (the cluster's log
// collection keeps it), the ring is what an operator reads on a live pod,
// and the counter is what alerts.
const (
	deadLetterCapacity = 256      // entries kept, oldest dropped first
	deadLetterMaxBytes = 16 << 10 // of one entry's occurrence JSON
)

// Reasons an occurrence is dead-lettered (the reason label).
const (
	dlTooLarge       = "too_large"        // the collector: over its size limit
	dlInvalid        = "invalid"          // the collector: cannot be stored
	dlMissingEventID = "missing_event_id" // the collector: no event_id
	dlBatchRefused   = "batch_refused"    // the collector refused the whole batch
	dlUnencodable    = "unencodable"      // the agent cannot encode it (invalid UTF-8)
	dlOther          = "other"            // a reason this agent does not know
)

var deadLetterReasons = []string{dlTooLarge, dlInvalid, dlMissingEventID, dlBatchRefused, dlUnencodable, dlOther}

func deadLetterReason(r string) string {
	for _, k := range deadLetterReasons {
		if k == r {
			return k
		}
	}
	return dlOther
}

// DeadLetter is one refused occurrence as /debug/deadletter shows it.
type DeadLetter struct {
	Time    time.Time `json:"time"`
	EventID string    `json:"event_id"`
	Reason  string    `json:"reason"`
	Message string    `json:"message,omitempty"`
	// Seq is the batch the occurrence was shipped in.
	Seq uint64 `json:"seq"`
	// Occurrence is the refused occurrence as protobuf JSON, cut at 16 KiB
	// (OccurrenceTruncated then says so).
	Occurrence          json.RawMessage `json:"occurrence,omitempty"`
	OccurrenceTruncated bool            `json:"occurrence_truncated,omitempty"`
}

// deadLetters is the bounded ring. Its zero value is not usable: use
// newDeadLetters.
type deadLetters struct {
	log *slog.Logger
	m   *metrics

	mu      sync.Mutex
	ring    []DeadLetter
	next    int
	total   uint64
	evicted uint64
}

func newDeadLetters(log *slog.Logger, m *metrics) *deadLetters {
	return &deadLetters{log: log, m: m, ring: make([]DeadLetter, 0, deadLetterCapacity)}
}

// add records one refused occurrence (o may be nil when the collector named
// an index the agent cannot map back).
func (d *deadLetters) add(seq uint64, o *eventpipev1.Occurrence, eventID, reason, msg string) {
	reason = deadLetterReason(reason)
	if eventID == "" {
		eventID = o.GetEventId()
	}
	e := DeadLetter{Time: time.Now().UTC(), EventID: eventID, Reason: reason, Message: msg, Seq: seq}
	if o != nil {
		b, err := protojson.MarshalOptions{AllowPartial: true}.Marshal(o)
		switch {
		case err != nil:
			// Not encodable as protobuf JSON either (invalid UTF-8): keep
			// what identifies it.
			e.Occurrence, _ = json.Marshal(map[string]string{"encode_error": err.Error(), "namespace": o.GetNamespace(),
				"reason": o.GetReason(), "involved": o.GetInvolvedObject().GetKind() + "/" + o.GetInvolvedObject().GetName()})
		case len(b) > deadLetterMaxBytes:
			// Cut inside a JSON string would make invalid JSON: keep it as a
			// JSON string instead.
			e.Occurrence, _ = json.Marshal(string(b[:deadLetterMaxBytes]))
			e.OccurrenceTruncated = true
		default:
			e.Occurrence = b
		}
	}
	d.m.deadLetters.WithLabelValues(reason).Inc()
	d.log.Error("occurrence refused for good; dead-lettered and skipped (see /debug/deadletter)",
		"event_id", eventID, "reason", reason, "detail", msg, "seq", seq,
		"namespace", o.GetNamespace(), "event_reason", o.GetReason())
	d.mu.Lock()
	defer d.mu.Unlock()
	d.total++
	if len(d.ring) < cap(d.ring) {
		d.ring = append(d.ring, e)
		return
	}
	d.ring[d.next] = e
	d.next = (d.next + 1) % len(d.ring)
	d.evicted++
}

// entries returns the kept dead letters, oldest first, and how many were
// recorded and dropped from the ring since start.
func (d *deadLetters) entries() (out []DeadLetter, total, evicted uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out = make([]DeadLetter, 0, len(d.ring))
	out = append(out, d.ring[d.next:]...)
	out = append(out, d.ring[:d.next]...)
	return out, d.total, d.evicted
}

// serveHTTP writes one JSON object per line: a header line with the counts
// ({"total":N,"evicted":M,"capacity":C}), then the entries, oldest first.
func (d *deadLetters) serveHTTP(w http.ResponseWriter, _ *http.Request) {
	es, total, evicted := d.entries()
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]uint64{"total": total, "evicted": evicted, "capacity": deadLetterCapacity})
	for i := range es {
		if err := enc.Encode(&es[i]); err != nil {
			return
		}
	}
}

package enrich

import (
	"container/list"
	"strings"
	"sync"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// trackerKey names one container of one pod (pod is its UID when byUID,
// else its name).
type trackerKey struct {
	namespace, pod, container string
	byUID                     bool
}

// failure is one pull-failure signal fed to the tracker.
type failure struct {
	category, image, detail string
	confidence              string // a Confidence* constant (constant strings: no copy kept)
	at                      time.Time
	first                   time.Time // when the Event first saw it (<= at)
	eventUID                string
	count                   int32
	source                  string
	// backoff: a pod status in ImagePullBackOff (between attempts), not a
	// new attempt.
	backoff bool
}

// pullState is the tracker's verdict for one key.
type pullState struct {
	category, image, detail string
	confidence              string
	attempts                uint32
	firstSeen, lastSeen     time.Time
}

// maxCountedEvents bounds the per-entry Event UIDs whose counts are summed:
// kubelet aggregates one pod's pull failures into a handful of Events.
const maxCountedEvents = 8

type trackerEntry struct {
	key   trackerKey
	state pullState
	// Per cause-bearing Event UID, the highest count seen: a count bump of
	// the same Event is not a new failure on top of the old count. A few
	// entries (at most maxCountedEvents, plus "" for the overflow): a
	// slice scans faster than a map hashes.
	counts []uidCount
	// pod_status attempts counted separately (they see the same failures
	// as events); lastStatusID de-duplicates re-seen pod versions.
	statusSignals uint32
	lastStatusID  string
	elem          *list.Element
}

type uidCount struct {
	uid string
	n   int32
}

// count returns the count kept for uid, or nil.
func (en *trackerEntry) count(uid string) *int32 {
	for i := range en.counts {
		if en.counts[i].uid == uid {
			return &en.counts[i].n
		}
	}
	return nil
}

// addOverflow adds n to the count of the "" entry.
func (en *trackerEntry) addOverflow(n int32) {
	if p := en.count(""); p != nil {
		*p += n
		return
	}
	en.counts = append(en.counts, uidCount{n: n})
}

// pullTracker is a bounded LRU of pull state per (pod, container).
type pullTracker struct {
	mu       sync.Mutex
	capacity int
	entries  map[trackerKey]*trackerEntry
	lru      *list.List // front = most recent; values are *trackerEntry
}

func newPullTracker(capacity int) *pullTracker {
	return &pullTracker{capacity: capacity, entries: make(map[trackerKey]*trackerEntry), lru: list.New()}
}

// record folds f into the key's state and returns the updated state. A
// failure with no cause (unknown) inherits the last known cause for the
// same image, with its confidence; a new image or a gap longer than window
// starts afresh.
func (t *pullTracker) record(k trackerKey, f failure, window time.Duration) pullState {
	t.mu.Lock()
	defer t.mu.Unlock()
	en := t.entries[k]
	if en != nil {
		stale := f.at.Sub(en.state.lastSeen) > window
		otherImage := f.image != "" && en.state.image != "" && f.image != en.state.image
		if stale || otherImage {
			t.removeLocked(en)
			en = nil
		}
	}
	if f.first.IsZero() || f.first.After(f.at) {
		f.first = f.at
	}
	if en == nil {
		// The tracker outlives events: own copies, so a kept substring
		// never pins a large message or a stale cached object.
		k = trackerKey{namespace: strings.Clone(k.namespace), pod: strings.Clone(k.pod), container: strings.Clone(k.container), byUID: k.byUID}
		en = &trackerEntry{key: k, counts: make([]uidCount, 0, 2)}
		en.state.firstSeen, en.state.lastSeen = f.first, f.at
		en.elem = t.lru.PushFront(en)
		t.entries[k] = en
		for len(t.entries) > t.capacity {
			t.removeLocked(t.lru.Back().Value.(*trackerEntry))
		}
	} else {
		t.lru.MoveToFront(en.elem)
	}
	s := &en.state
	if f.first.Before(s.firstSeen) {
		s.firstSeen = f.first
	}
	if f.at.After(s.lastSeen) {
		s.lastSeen = f.at
	}
	if f.image != "" && f.image != s.image {
		s.image = strings.Clone(f.image)
	}
	if f.category != eventpipev1.CategoryUnknown {
		s.category, s.confidence = f.category, f.confidence
		if f.detail != s.detail {
			s.detail = strings.Clone(f.detail)
		}
		switch {
		case f.source == eventpipev1.PullSourcePodStatus:
			if f.eventUID != en.lastStatusID && (!f.backoff || en.statusSignals == 0) {
				en.statusSignals++
			}
			if en.lastStatusID != f.eventUID {
				en.lastStatusID = strings.Clone(f.eventUID)
			}
		case f.eventUID == "":
			en.addOverflow(f.count)
		default:
			if p := en.count(f.eventUID); p != nil {
				*p = max(*p, f.count)
			} else if len(en.counts) < maxCountedEvents {
				en.counts = append(en.counts, uidCount{strings.Clone(f.eventUID), f.count})
			} else {
				en.addOverflow(f.count)
			}
		}
	} else if s.category == "" {
		s.category, s.confidence = f.category, f.confidence
	}
	var sum uint32
	for _, c := range en.counts {
		if c.n > 0 {
			sum += uint32(c.n)
		}
	}
	s.attempts = max(sum, en.statusSignals, 1)
	return *s
}

// forget drops a key's state (the image was pulled).
func (t *pullTracker) forget(k trackerKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if en := t.entries[k]; en != nil {
		t.removeLocked(en)
	}
}

func (t *pullTracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

func (t *pullTracker) removeLocked(en *trackerEntry) {
	t.lru.Remove(en.elem)
	delete(t.entries, en.key)
}

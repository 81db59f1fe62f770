package enrich

import (
	"container/list"
	"strings"
	"sync"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// blockerTracker is the pull tracker's design applied to blockers: a
// bounded LRU of state per (object, container, kind) that counts how often
// a cause was seen within the window (Event counts, summed over at most a
// few Event UIDs and taking each UID's highest count; a container's restart
// count from its pod status), so the disposition can turn persistent. A
// restart back-off that names no cause (weak) keeps the cause the pod
// status gave (OOMKilled, an exit code); a different strong cause starts
// afresh.
type blockerTracker struct {
	mu       sync.Mutex
	capacity int
	entries  map[blockerKey]*blockerEntry
	lru      *list.List // front = most recent; values are *blockerEntry
}

type blockerKey struct {
	namespace, object, container, kind string
}

type blockerSignal struct {
	class     blockerClass
	at, first time.Time
	eventUID  string // "" for a pod status
	count     int32  // the Event's count
	restarts  int32  // a pod status's restart count
	source    string
}

type blockerState struct {
	cause, object, detail string
	confidence            string // a Confidence* constant
	attempts              uint32
	firstSeen, lastSeen   time.Time
}

type blockerEntry struct {
	key      blockerKey
	state    blockerState
	counts   []uidCount
	restarts int32
	// weakOnly: every signal so far was a back-off naming no cause, so a
	// cause that arrives later (the pod status's OOMKilled) refines it
	// instead of starting afresh.
	weakOnly bool
	elem     *list.Element
}

func newBlockerTracker(capacity int) *blockerTracker {
	return &blockerTracker{capacity: capacity, entries: make(map[blockerKey]*blockerEntry), lru: list.New()}
}

func (t *blockerTracker) record(k blockerKey, s blockerSignal, window time.Duration) blockerState {
	t.mu.Lock()
	defer t.mu.Unlock()
	en := t.entries[k]
	if en != nil {
		stale := s.at.Sub(en.state.lastSeen) > window
		otherCause := !s.class.weak && !en.weakOnly && en.state.cause != s.class.cause
		if stale || otherCause {
			t.removeLocked(en)
			en = nil
		}
	}
	if s.first.IsZero() || s.first.After(s.at) {
		s.first = s.at
	}
	if en == nil {
		// Own copies: the tracker outlives the event and its cached objects.
		k = blockerKey{strings.Clone(k.namespace), strings.Clone(k.object), strings.Clone(k.container), k.kind}
		en = &blockerEntry{key: k, counts: make([]uidCount, 0, 2), weakOnly: true}
		en.state.firstSeen, en.state.lastSeen = s.first, s.at
		en.state.cause, en.state.confidence = s.class.cause, s.class.strength.String()
		en.elem = t.lru.PushFront(en)
		t.entries[k] = en
		for len(t.entries) > t.capacity {
			t.removeLocked(t.lru.Back().Value.(*blockerEntry))
		}
	} else {
		t.lru.MoveToFront(en.elem)
	}
	st := &en.state
	if s.first.Before(st.firstSeen) {
		st.firstSeen = s.first
	}
	if s.at.After(st.lastSeen) {
		st.lastSeen = s.at
	}
	if !s.class.weak {
		st.cause, st.confidence, en.weakOnly = s.class.cause, s.class.strength.String(), false
	}
	if !s.class.weak || st.detail == "" {
		if s.class.detail != st.detail {
			st.detail = strings.Clone(s.class.detail)
		}
		if s.class.object != "" && s.class.object != st.object {
			st.object = strings.Clone(s.class.object)
		}
	}
	switch {
	case s.source == eventpipev1.PullSourcePodStatus:
		en.restarts = max(en.restarts, s.restarts)
	case s.eventUID == "":
		en.addOverflow(s.count)
	default:
		if p := en.count(s.eventUID); p != nil {
			*p = max(*p, s.count)
		} else if len(en.counts) < maxCountedEvents {
			en.counts = append(en.counts, uidCount{strings.Clone(s.eventUID), s.count})
		} else {
			en.addOverflow(s.count)
		}
	}
	var sum uint32
	for _, c := range en.counts {
		if c.n > 0 {
			sum += uint32(c.n)
		}
	}
	st.attempts = max(sum, uint32(max(en.restarts, 0)), 1)
	return *st
}

func (en *blockerEntry) count(uid string) *int32 {
	for i := range en.counts {
		if en.counts[i].uid == uid {
			return &en.counts[i].n
		}
	}
	return nil
}

func (en *blockerEntry) addOverflow(n int32) {
	if p := en.count(""); p != nil {
		*p += n
		return
	}
	en.counts = append(en.counts, uidCount{n: n})
}

func (t *blockerTracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

func (t *blockerTracker) removeLocked(en *blockerEntry) {
	t.lru.Remove(en.elem)
	delete(t.entries, en.key)
}

// persistentBlocker reports whether retrying cannot fix the cause: it
// stays until someone changes the cluster or the sandbox (a taint no node
// tolerates, a class or Secret that does not exist, a quota, a policy, a
// container that keeps dying, a probe that keeps failing). Persistent also
// needs the count (PersistentAfter) and time: the cause seen for at least
// blockerMinAge. Capacity (insufficient_resources) can free
// up or be added by an autoscaler, attach and mount errors are often
// transient, and an unknown cause is never called persistent.
func persistentBlocker(cause string) bool {
	switch cause {
	case eventpipev1.BlockerUntoleratedTaint, eventpipev1.BlockerNodeSelectorMismatch, eventpipev1.BlockerPodAffinity,
		eventpipev1.BlockerTopologySpread, eventpipev1.BlockerUnboundPVC, eventpipev1.BlockerVolumeNodeAffinity,
		eventpipev1.BlockerNoStorageClass, eventpipev1.BlockerStorageClassNotFound,
		eventpipev1.BlockerSecretNotFound, eventpipev1.BlockerConfigMapNotFound, eventpipev1.BlockerKeyNotFound,
		eventpipev1.BlockerQuotaExceeded, eventpipev1.BlockerWebhookDenied, eventpipev1.BlockerPodSecurity,
		eventpipev1.BlockerLimitRange, eventpipev1.BlockerServiceAccountMissing, eventpipev1.BlockerNamespaceTerminating,
		eventpipev1.BlockerCrashLoop, eventpipev1.BlockerOOMKilled, eventpipev1.BlockerExitError, eventpipev1.BlockerStartFailed,
		eventpipev1.BlockerReadinessProbe, eventpipev1.BlockerLivenessProbe, eventpipev1.BlockerStartupProbe:
		return true
	}
	return false
}

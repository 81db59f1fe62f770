package enrich

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"time"
	"unsafe"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Enricher turns Events into Occurrences. It is safe for concurrent use.
type Enricher struct {
	cfg     Config
	cluster string // cfg.Cluster, cleaned once
	lk      Lookups
	rules   compiledRules
	tracker *pullTracker
	blocks  *blockerTracker // blocker_tracker.go
}

// Result is the outcome of Enrich.
type Result struct {
	// Occurrence is always complete and valid (attributed or not).
	Occurrence *eventpipev1.Occurrence
	// Missing: the involved object or the owner needed to attribute it is
	// not in the caches (yet). The agent holds such events briefly and calls
	// Enrich again; Occurrence is still complete (unattributed, or
	// attributed by a rule that needs no cache, e.g. the supervisor name).
	// Precisely: the involved Pod or Sandbox is not cached (a pod's spec is
	// needed for images), an unattributed PVC is not cached, a cached object
	// names a Sandbox owner that is not cached, or the workspace depends on
	// a Namespace that is not cached. Kinds enrich does not track are never
	// Missing.
	Missing bool
}

// New validates cfg and returns an Enricher reading lk. Nil lookups behave as
// empty caches.
func New(cfg Config, lk Lookups) (*Enricher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("enrich config: %w", err)
	}
	return &Enricher{
		cfg:     cfg,
		cluster: clean(cfg.Cluster),
		lk:      lk,
		rules:   compileRules(cfg.Rules),
		tracker: newPullTracker(cfg.TrackerCapacity),
		blocks:  newBlockerTracker(cfg.TrackerCapacity),
	}, nil
}

// Enrich attributes and diagnoses one Event. observedAt is when the caller
// saw it (the occurrence time's last fallback). ev is not modified.
func (e *Enricher) Enrich(ev *Event, observedAt time.Time) Result {
	if ev == nil {
		ev = &Event{}
	}
	o, missing := e.enrichEvent(ev, observedAt, eventpipev1.PullSourceEvent, false)
	return Result{Occurrence: o, Missing: missing}
}

func (e *Enricher) enrich(ev *Event, observedAt time.Time, source string, backoff bool) *eventpipev1.Occurrence {
	o, _ := e.enrichEvent(ev, observedAt, source, backoff)
	return o
}

func (e *Enricher) enrichEvent(ev *Event, observedAt time.Time, source string, backoff bool) (*eventpipev1.Occurrence, bool) {
	occurredAt := OccurrenceTime(ev, observedAt)
	msg, truncated := truncateUTF8(ev.Message, e.cfg.MaxMessageBytes)
	// Classify first (it reads only the event) so that the occurrence, its
	// always-present parts and the pull failure or progress part it will
	// have cost one allocation.
	var c classified
	c.msgImage = imageFromMessage(ev.Message)
	classifyMsg, classifyImage := ev.Message, c.msgImage
	if len(classifyMsg) > maxClassifyBytes {
		classifyMsg = classifyMsg[:maxClassifyBytes]
		classifyImage = imageFromMessage(classifyMsg)
	}
	c.verdict, c.pull = classifyPull(ev.Reason, classifyMsg, classifyImage)
	c.container, _ = containerFromFieldPath(ev.Involved.FieldPath)
	var blk *occAlloc
	switch {
	case c.pull:
		b := &occPullAlloc{}
		blk, c.pa = &b.occAlloc, &b.pull
	case e.mayProgress(ev, c.container):
		b := &occProgressAlloc{}
		blk, c.progress = &b.occAlloc, &b.progress
	default:
		blk = &occAlloc{}
	}
	o := &blk.o
	o.SchemaVersion = eventpipev1.SchemaVersion
	r := &ev.Involved
	f := [nEventFields]string{
		fUID: ev.UID, fRV: ev.ResourceVersion, fNS: ev.Namespace, fName: ev.Name, fAPI: ev.APIVersion,
		fKind: r.Kind, fRefAPI: r.APIVersion, fRefNS: r.Namespace, fRefName: r.Name, fRefUID: r.UID, fFieldPath: r.FieldPath,
		fType: ev.Type, fReason: ev.Reason, fComponent: ev.ReportingComponent, fInstance: ev.ReportingInstance, fAction: ev.Action,
	}
	cleanFields(f[:])
	switch {
	case f[fUID] != "" && f[fRV] != "":
		o.EventId = blk.eventID(f[fUID], f[fRV])
	case f[fUID] != "":
		o.EventId = noRVEventID(ev, f[fUID])
	default:
		o.EventId = noUIDEventID(ev, f[fNS], f[fName], f[fRV])
	}
	setTime(&blk.occurred, occurredAt)
	setTime(&blk.observed, nonZero(observedAt, occurredAt))
	o.OccurredAt, o.ObservedAt = &blk.occurred, &blk.observed
	o.Cluster = e.cluster
	o.Namespace = f[fNS]
	blk.ev.Name, blk.ev.Uid, blk.ev.ResourceVersion, blk.ev.ApiVersion = f[fName], f[fUID], f[fRV], f[fAPI]
	o.Event = &blk.ev
	blk.obj.Kind, blk.obj.ApiVersion, blk.obj.Namespace = f[fKind], f[fRefAPI], f[fNS]
	if r.Namespace != ev.Namespace {
		blk.obj.Namespace = f[fRefNS]
	}
	blk.obj.Name, blk.obj.Uid, blk.obj.FieldPath = f[fRefName], f[fRefUID], f[fFieldPath]
	o.InvolvedObject = &blk.obj
	o.Type, o.Reason = f[fType], f[fReason]
	o.Message, o.MessageTruncated = msg, truncated
	o.Count = max(ev.Count, 1)
	o.ReportingComponent, o.ReportingInstance = f[fComponent], f[fInstance]
	o.Action = f[fAction]
	a := e.attribute(&ev.Involved, ev.Namespace, &blk.sb)
	e.fill(o, &a, ev, &c, occurredAt, source, backoff)
	return o, a.missing
}

// The event's string fields, cleaned together (cleanFields).
const (
	fUID = iota
	fRV
	fNS
	fName
	fAPI
	fKind
	fRefAPI
	fRefNS
	fRefName
	fRefUID
	fFieldPath
	fType
	fReason
	fComponent
	fInstance
	fAction
	nEventFields
)

// classified is what enrichEvent learns from the event alone, before it
// allocates: the pull classification, the container and where the pull
// failure or progress part goes (nil: allocate one if needed).
type classified struct {
	msgImage, container string
	verdict             Verdict
	pull                bool
	pa                  *pullAlloc
	progress            *eventpipev1.Progress
}

// occAlloc holds an occurrence and the parts every occurrence has, so they
// cost one allocation.
type occAlloc struct {
	o                  eventpipev1.Occurrence
	ev                 eventpipev1.EventRef
	obj                eventpipev1.ObjectRef
	occurred, observed timestamppb.Timestamp
	sb                 eventpipev1.Sandbox // linked only when attributed
	// id holds event_id's bytes when they fit: 840 bytes of parts, these
	// 48 (a UID, "/" and an 11-digit resourceVersion: etcd revisions up to
	// 99,999,999,999) and the allocator's 8-byte header for objects with
	// pointers fill the 896-byte size class, and the id then costs no
	// allocation of its own (a longer one costs one: eventID).
	id [eventIDBytes]byte
}

// eventIDBytes was 56 (a 19-digit resourceVersion) until
// Sandbox.deleted_at took 8 bytes of the part.
const eventIDBytes = 48

// occPullAlloc is an occurrence with a pull failure (1,176 bytes and the
// header: the 1,280-byte size class since PullFailure gained decided_by
// and confidence; only pull-failure events pay the larger class).
type occPullAlloc struct {
	occAlloc
	pull pullAlloc
}

// occProgressAlloc is an occurrence that may move the gateway's progress.
type occProgressAlloc struct {
	occAlloc
	progress eventpipev1.Progress
}

// eventID returns uid + "/" + rv, in b.id when it fits. The bytes are
// written once, here, and never again, so the string is immutable like any
// other; it keeps the block alive, as the occurrence's other parts do.
func (b *occAlloc) eventID(uid, rv string) string {
	n := len(uid) + 1 + len(rv)
	if n > len(b.id) {
		return uid + "/" + rv
	}
	copy(b.id[:], uid)
	b.id[len(uid)] = '/'
	copy(b.id[len(uid)+1:], rv)
	return unsafe.String(&b.id[0], n)
}

// noUIDEventID names an occurrence of an Event without uid (a file or a
// replay; the API server always sets one): "nouid/<namespace>/<name>/<rv>",
// stable for the same object version as uid/rv is, and unlike "/<rv>" not
// shared by different Events. When name or resourceVersion is empty too, a
// hash of what the Event says (reason, message, involved object, count, its
// own timestamps; never the time it was seen) is appended, so two
// different such Events still get different ids and the same one the same.
func noUIDEventID(ev *Event, ns, name, rv string) string {
	id := "nouid/" + ns + "/" + name + "/" + rv
	if name != "" && rv != "" {
		return id
	}
	return fmt.Sprintf("%s/%016x", id, contentHash(ev))
}

// noRVEventID names an occurrence of an Event with a uid but no
// resourceVersion (a file or a replay that dropped it):
// "<uid>/norv-<hash>", the hash of what changes from one version of an
// Event to the next (count, series and other timestamps, message) and of
// the rest of what it says. "<uid>/" alone would be the same for every
// version, and the collector would de-duplicate all but the first away.
// The same version read twice gets the same id.
func noRVEventID(ev *Event, uid string) string {
	return fmt.Sprintf("%s/norv-%016x", uid, contentHash(ev))
}

// contentHash hashes what an Event says (reason, message, involved object,
// count, its own timestamps; never the time it was seen), so it tells
// versions and Events apart without a resourceVersion.
func contentHash(ev *Event) uint64 {
	h := fnv.New64a()
	r := &ev.Involved
	for _, s := range []string{ev.Type, ev.Reason, ev.Message, ev.Action, r.Kind, r.APIVersion, r.Namespace, r.Name, r.UID,
		r.FieldPath, ev.ReportingComponent, ev.ReportingInstance} {
		_, _ = h.Write([]byte(s))
		_, _ = h.Write([]byte{0})
	}
	var b [12]byte
	binary.LittleEndian.PutUint32(b[:4], uint32(ev.Count))
	_, _ = h.Write(b[:4])
	for _, t := range []time.Time{ev.FirstTimestamp, ev.LastTimestamp, ev.EventTime, ev.SeriesLastObserved} {
		binary.LittleEndian.PutUint64(b[:8], uint64(t.Unix()))
		binary.LittleEndian.PutUint32(b[8:], uint32(t.Nanosecond()))
		_, _ = h.Write(b[:])
	}
	return h.Sum64()
}

// pullAlloc is a PullFailure and its timestamps in one allocation.
type pullAlloc struct {
	pf          eventpipev1.PullFailure
	first, last timestamppb.Timestamp
}

func setTime(ts *timestamppb.Timestamp, t time.Time) {
	ts.Seconds, ts.Nanos = t.Unix(), int32(t.Nanosecond())
}

// fill sets the attribution, role, container, image, pull failure and
// progress parts of o from a, c and the event.
func (e *Enricher) fill(o *eventpipev1.Occurrence, a *attribution, ev *Event, c *classified, at time.Time, source string, backoff bool) {
	o.Attribution = a.rule
	o.Role = a.role
	if a.sandbox != nil {
		o.Sandbox = a.sandbox
	}
	container := c.container
	// A pull message names the image; fall back to the pod spec.
	image := c.msgImage
	if container == "" && image != "" && a.pod != nil {
		container = containerForImage(a.pod, image)
	}
	if image == "" && container != "" && a.pod != nil {
		if c := findContainer(a.pod, container); c != nil {
			image = c.Image
		}
	}
	o.Container = clean(container)
	o.Image = cleanImage(image)
	if o.Image != "" {
		o.ImageRole = e.rules.eventImageRole(ev.Reason, container, a.pod)
	}

	if c.pull {
		img := c.verdict.Image
		if img == "" {
			img = NormalizeImage(image) // from the pod spec
		}
		key := podKey(ev, a.pod, container)
		signal := ev.UID
		if source == eventpipev1.PullSourcePodStatus {
			// One signal per pod version and container.
			signal = o.EventId
		}
		st := e.tracker.record(key, failure{
			category:   c.verdict.Category,
			confidence: c.verdict.Confidence,
			image:      img,
			detail:     c.verdict.Detail,
			at:         at,
			first:      firstFailure(ev, at),
			eventUID:   signal,
			count:      max(ev.Count, 1),
			source:     source,
			backoff:    backoff,
		}, e.cfg.PersistentWindow)
		disp := eventpipev1.DispositionRetrying
		if persistentCategory(st.category) && int(st.attempts) >= e.cfg.PersistentAfter {
			disp = eventpipev1.DispositionPersistent
		}
		if o.Image == "" && st.image != "" {
			o.Image = cleanImage(st.image)
			o.ImageRole = e.rules.eventImageRole(ev.Reason, container, a.pod)
		}
		pa := c.pa
		if pa == nil {
			pa = &pullAlloc{}
		}
		pf := &pa.pf
		pf.Category, pf.Image, pf.Disposition, pf.Attempts = st.category, cleanImage(st.image), disp, st.attempts
		setTime(&pa.first, st.firstSeen)
		setTime(&pa.last, st.lastSeen)
		pf.FirstSeen, pf.LastSeen = &pa.first, &pa.last
		pf.Detail, pf.Source = clean(st.detail), source
		pf.DecidedBy, pf.Confidence = eventpipev1.DecidedByTextRule, st.confidence
		o.PullFailure = pf
	} else if ev.Involved.Kind == "Pod" && container != "" && (ev.Reason == "Pulled" || ev.Reason == "Started") {
		// The container got its image: its failure history is over.
		e.tracker.forget(podKey(ev, a.pod, container))
	}
	if !c.pull && source == eventpipev1.PullSourceEvent {
		o.Blocker = e.blocker(ev, a.pod, container, at, a.sandbox != nil) // nil unless a blocker (blocker.go)
	}
	o.Progress = e.progress(ev, a, container, o.Image, c.progress)
}

// firstFailure is when an aggregated Event (count > 1) first saw the
// failure: firstTimestamp, else eventTime (events.k8s.io series), else at.
func firstFailure(ev *Event, at time.Time) time.Time {
	if t := ev.FirstTimestamp; validTime(t) && !t.After(at) {
		return t.UTC()
	}
	if t := ev.EventTime; validTime(t) && !t.After(at) {
		return t.UTC()
	}
	return at
}

// podKey names a container's pull state: by pod UID (the cached pod's, else
// the event's), so events and pod statuses meet, and a re-created pod of the
// same name starts afresh; by name when no UID is known.
func podKey(ev *Event, pod *Pod, container string) trackerKey {
	k := trackerKey{namespace: ev.Involved.Namespace, pod: ev.Involved.Name, container: container}
	if k.namespace == "" {
		k.namespace = ev.Namespace
	}
	switch {
	case pod != nil && pod.UID != "":
		k.pod, k.byUID = pod.UID, true
	case ev.Involved.UID != "":
		k.pod, k.byUID = ev.Involved.UID, true
	}
	return k
}

// progress computes the gateway's progress keys, correctly: only events
// about the workload pod move them, and only the workload container's
// Pulled/Started complete the pull and start steps.
// p, when not nil, is where to write it (part of the occurrence's
// allocation).
func (e *Enricher) progress(ev *Event, a *attribution, container, image string, p *eventpipev1.Progress) *eventpipev1.Progress {
	if a.role != eventpipev1.RoleWorkload || ev.Involved.Kind != "Pod" {
		return nil
	}
	switch ev.Reason {
	case "Scheduled", "Pulling":
	case "Pulled", "Started":
		if container != e.cfg.Rules.ProgressContainer {
			return nil
		}
	default:
		return nil
	}
	if p == nil {
		p = &eventpipev1.Progress{}
	}
	switch ev.Reason {
	case "Scheduled":
		p.CompleteStep, p.CompleteLabel, p.ActiveStep = eventpipev1.StepRequestingSandbox, "Sandbox allocated", eventpipev1.StepPullingImage
	case "Pulling":
		p.ActiveStep, p.ActiveDetail = eventpipev1.StepPullingImage, image
	case "Pulled":
		p.CompleteStep, p.CompleteLabel, p.ActiveStep = eventpipev1.StepPullingImage, "Image pulled", eventpipev1.StepStartingSandbox
	case "Started":
		p.CompleteStep, p.CompleteLabel = eventpipev1.StepStartingSandbox, "Sandbox started"
	}
	return p
}

// mayProgress: whether progress can return a value for ev, judged before
// attribution (so an event about another pod may reserve the part and not
// use it).
func (e *Enricher) mayProgress(ev *Event, container string) bool {
	if ev.Involved.Kind != "Pod" {
		return false
	}
	switch ev.Reason {
	case "Scheduled", "Pulling":
		return true
	case "Pulled", "Started":
		return container == e.cfg.Rules.ProgressContainer
	}
	return false
}

// OccurrenceTime is series.lastObservedTime, else lastTimestamp, else
// eventTime, else firstTimestamp, else observedAt, else the current time:
// never zero.
func OccurrenceTime(ev *Event, observedAt time.Time) time.Time {
	// Tested one by one, not ranged over a slice: no copying of five times
	// on every event.
	switch {
	case validTime(ev.SeriesLastObserved):
		return ev.SeriesLastObserved.UTC()
	case validTime(ev.LastTimestamp):
		return ev.LastTimestamp.UTC()
	case validTime(ev.EventTime):
		return ev.EventTime.UTC()
	case validTime(ev.FirstTimestamp):
		return ev.FirstTimestamp.UTC()
	case validTime(observedAt):
		return observedAt.UTC()
	}
	return time.Now().UTC()
}

// maxUnix is 9999-12-31T23:59:59Z, the last instant a Timestamp can carry.
const maxUnix = 253402300799

func validTime(t time.Time) bool { return t.Unix() > 0 && t.Unix() <= maxUnix }

func nonZero(t, fallback time.Time) time.Time {
	if !validTime(t) {
		return fallback
	}
	return t.UTC()
}

// persistentCategory reports whether retrying the pull cannot fix the cause.
// runtime_store is persistent: a damaged snapshotter, content store or
// overlay2 store fails every retry the same way until someone acts on the
// node (every such report in the pull corpus was cleared by removing the
// image or the ingest directory, or by restarting or replacing the node);
// the disposition turns persistent only after PersistentAfter failures, so
// a one-off race that the next retry clears never gets there. Timeout,
// registry_unreachable, rate_limited, kubelet_throttled and node_storage
// stay retrying: each can clear by itself (the link, the limit's window,
// the kubelet's image garbage collection).
func persistentCategory(c string) bool {
	switch c {
	case eventpipev1.CategoryNotFound, eventpipev1.CategoryUnauthorized,
		eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.CategoryInvalidReference,
		eventpipev1.CategoryNeverPull, eventpipev1.CategoryPlatformMismatch,
		eventpipev1.CategoryPolicyRejected, eventpipev1.CategoryRuntimeStore,
		eventpipev1.CategoryUnsupportedFormat:
		return true
	}
	return false
}

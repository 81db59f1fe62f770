package enrich

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// blockerAlloc is a Blocker and its timestamps in one allocation (only
// blocker occurrences pay for it).
type blockerAlloc struct {
	b           eventpipev1.Blocker
	first, last timestamppb.Timestamp
}

// blocker diagnoses an Event: nil for every event that is no blocker, which
// the reason switch in classifyBlocker decides at the cost of a few length
// compares.
func (e *Enricher) blocker(ev *Event, pod *Pod, container string, at time.Time) *eventpipev1.Blocker {
	msg := ev.Message
	if len(msg) > maxClassifyBytes {
		msg = msg[:maxClassifyBytes]
	}
	bc, ok := classifyBlocker(ev.Reason, msg)
	if !ok {
		return nil
	}
	return e.recordBlocker(ev, pod, container, bc, blockerSignal{
		class: bc, at: at, first: firstFailure(ev, at), eventUID: ev.UID, count: max(ev.Count, 1),
		source: eventpipev1.PullSourceEvent,
	}, 0)
}

// recordBlocker folds one signal into the tracker and builds the Blocker.
func (e *Enricher) recordBlocker(ev *Event, pod *Pod, container string, bc blockerClass, sig blockerSignal, exitCode int32) *eventpipev1.Blocker {
	if bc.kind != eventpipev1.BlockerKindContainer {
		// Scheduling, volumes and creation are about the pod or controller
		// as a whole, whatever field path the reporter set.
		container = ""
	}
	// The tracker keeps these past the event: bounded, valid UTF-8 copies.
	sig.class.object, sig.class.detail = clean(bc.object), clean(bc.detail)
	st := e.blocks.record(blockerTrackerKey(ev, pod, container, bc.kind), sig, e.cfg.PersistentWindow)
	ba := &blockerAlloc{}
	b := &ba.b
	b.Kind, b.Cause, b.Container = bc.kind, st.cause, clean(container)
	b.Object = clean(st.object)
	if b.Object == "" && ev.Involved.Name != "" {
		b.Object = clean(ev.Involved.Kind + "/" + ev.Involved.Name)
	}
	b.Disposition = eventpipev1.DispositionRetrying
	if persistentBlocker(st.cause) && int(st.attempts) >= e.cfg.PersistentAfter {
		b.Disposition = eventpipev1.DispositionPersistent
	}
	b.Attempts = st.attempts
	setTime(&ba.first, st.firstSeen)
	setTime(&ba.last, st.lastSeen)
	b.FirstSeen, b.LastSeen = &ba.first, &ba.last
	b.Detail = st.detail
	b.Source = sig.source
	b.DecidedBy, b.Confidence = eventpipev1.DecidedByTextRule, st.confidence
	if exitCode != 0 {
		b.ExitCode, b.HasExitCode = exitCode, true
	}
	b.Fix = BlockerFix(b)
	return b
}

// blockerTrackerKey names the thing a blocker is counted for: the involved
// object by UID (the cached pod's when known), else by kind and name; the
// container for container blockers; the kind, so a pod that was
// unschedulable and later crashes keeps two counts.
func blockerTrackerKey(ev *Event, pod *Pod, container, kind string) blockerKey {
	k := blockerKey{namespace: ev.Involved.Namespace, container: container, kind: kind}
	if k.namespace == "" {
		k.namespace = ev.Namespace
	}
	switch {
	case pod != nil && pod.UID != "":
		k.object = pod.UID
	case ev.Involved.UID != "":
		k.object = ev.Involved.UID
	default:
		k.object = ev.Involved.Kind + "/" + ev.Involved.Name
	}
	return k
}

// diagnoseBlockedContainer turns a container's pod status into a blocker
// occurrence (source pod_status), like DiagnosePod does for image pulls:
// event_id "<pod UID>/<resourceVersion>/<container>", reporting component
// eventpipe-agent, attributed like an Event about the container. nil when
// the status shows no blocker.
func (e *Enricher) diagnoseBlockedContainer(p *Pod, c *Container, observedAt time.Time) *eventpipev1.Occurrence {
	bc, ok := classifyContainerStatus(c.WaitingReason, c.WaitingMessage, c.TerminatedReason, c.TerminatedExitCode, c.TerminatedExitCode != 0)
	if !ok {
		return nil
	}
	ev, at := podStatusEvent(p, c, observedAt)
	r := e.enrich(ev, at, eventpipev1.PullSourcePodStatus, false)
	r.Event = &eventpipev1.EventRef{Uid: clean(p.UID), ResourceVersion: clean(p.ResourceVersion), ApiVersion: "v1"}
	r.Blocker = e.recordBlocker(ev, p, c.Name, bc, blockerSignal{
		class: bc, at: at, first: at, restarts: c.RestartCount, source: eventpipev1.PullSourcePodStatus,
	}, c.TerminatedExitCode)
	return r
}

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
// compares. The signals that are blockers only once they last (probes, a
// provisioner's wait: classifyLasting) are tracked for a sandbox's objects
// only (sandbox set): elsewhere in a cluster probe failures are frequent
// and none of eventpipe's business, and they stay free.
func (e *Enricher) blocker(ev *Event, pod *Pod, container string, at time.Time, sandbox bool) *eventpipev1.Blocker {
	msg := ev.Message
	if len(msg) > maxClassifyBytes {
		msg = msg[:maxClassifyBytes]
	}
	bc, ok := classifyBlocker(ev.Reason, msg)
	if !ok {
		if !sandbox {
			return nil
		}
		if bc, ok = classifyLasting(ev.Reason, msg); !ok {
			return nil
		}
		if pastProbe(bc.cause, pod, container) { // containerready.go
			return nil
		}
	}
	return e.recordBlocker(ev, pod, container, bc, blockerSignal{
		class: bc, at: at, first: firstFailure(ev, at), eventUID: ev.UID, count: max(ev.Count, 1),
		source: eventpipev1.PullSourceEvent,
	}, 0)
}

// provisionerWait is how long a claim may wait on an external provisioner
// (ExternalProvisioning events, the first one's time to the last one's)
// before the wait is a blocker (provisioner_waiting, persistent): dynamic
// provisioning by a working CSI driver takes seconds to a minute or two;
// five minutes of waiting means no provisioner acts on the claim.
const provisionerWait = 5 * time.Minute

// blockerMinAge is how long a cause must have been seen (first to last
// time) before it can be persistent, whatever the count: the scheduler
// and the PV controller retry within a second when the cluster changes,
// so three reports can come before anything had time to fix itself (a
// claim the provisioner binds a second later). It must stay well under
// what a reporter can be heard for: client-go's event recorder lets 25
// Events per object through in a burst and then one every five minutes,
// so a controller retrying every 2 s falls silent after about 48 s (the PV
// controller on make run's control plane did: 25 FailedBinding reports
// over 47 s, then nothing, and with a one-minute age the claim stayed
// "retrying" for good). 30 s is past the one-second bursts and within any
// such silence.
const blockerMinAge = 30 * time.Second

// lasting reports whether a tracked signal of a lasting kind (lasting in
// blockerClass) has lasted long enough to be a blocker: a probe that
// failed as often as the kubelet's default failureThreshold, a claim that
// waited on its provisioner for provisionerWait.
func lasting(cause string, st blockerState, failures int) bool {
	if cause == eventpipev1.BlockerProvisionerWaiting {
		return st.lastSeen.Sub(st.firstSeen) >= provisionerWait
	}
	return int(st.attempts) >= failures
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
	if bc.lasting && !lasting(bc.cause, st, probeFailureThreshold) {
		return nil // transient so far: counted, not a blocker
	}
	ba := &blockerAlloc{}
	b := &ba.b
	b.Kind, b.Cause, b.Container = bc.kind, st.cause, clean(container)
	b.Object = clean(st.object)
	if b.Object == "" && ev.Involved.Name != "" {
		b.Object = clean(ev.Involved.Kind + "/" + ev.Involved.Name)
	}
	b.Disposition = eventpipev1.DispositionRetrying
	switch {
	case st.cause == eventpipev1.BlockerProvisionerWaiting:
		// It is a blocker only once it waited provisionerWait.
		b.Disposition = eventpipev1.DispositionPersistent
	case persistentBlocker(st.cause) && int(st.attempts) >= e.cfg.PersistentAfter && st.lastSeen.Sub(st.firstSeen) >= blockerMinAge:
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

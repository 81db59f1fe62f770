package enrich

import (
	"strconv"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// DiagnosePod turns a pod's container waiting states (ErrImagePull,
// ImagePullBackOff, InvalidImageName, ErrImageNeverPull, ...) into
// occurrences with pull_failure.source "pod_status", and the other waiting
// states that block a container (CrashLoopBackOff with the last
// termination's reason, CreateContainerConfigError, RunContainerError)
// into occurrences with blocker.source "pod_status". A container whose
// current state is terminated and that does not wait (restartPolicy Never,
// a failed init container: kubectl's Init:Error) is a blocker too when it
// was OOMKilled, could not start, or exited non-zero; Completed with exit
// code 0 is none. Their event_id is
// "<pod UID>/<resourceVersion>/<container>" ("nouid/<namespace>/<pod
// name>/<resourceVersion>/<container>" for a pod without uid), so re-seeing
// the same pod version is the same occurrence; reporting_component is "eventpipe-agent";
// they are attributed like an Event about that pod and container. It
// returns nil when nothing is waiting on an image or blocked.
func (e *Enricher) DiagnosePod(p *Pod, observedAt time.Time) []*eventpipev1.Occurrence {
	if p == nil {
		return nil
	}
	var out []*eventpipev1.Occurrence
	for i := range p.Containers {
		c := &p.Containers[i]
		if c.WaitingReason == "" {
			if c.Terminated {
				if o := e.diagnoseBlockedContainer(p, c, observedAt); o != nil { // blocker_occurrence.go
					out = append(out, o)
				}
			}
			continue
		}
		if _, _, _, ok := ClassifyPull(c.WaitingReason, c.WaitingMessage); !ok {
			if o := e.diagnoseBlockedContainer(p, c, observedAt); o != nil { // blocker_occurrence.go
				out = append(out, o)
			}
			continue
		}
		ev, at := podStatusEvent(p, c, observedAt)
		r := e.enrich(ev, at, eventpipev1.PullSourcePodStatus, c.WaitingReason == "ImagePullBackOff")
		r.Event = &eventpipev1.EventRef{Uid: clean(p.UID), ResourceVersion: clean(p.ResourceVersion), ApiVersion: "v1"}
		if c.Image != "" && r.PullFailure != nil && r.PullFailure.Image == "" {
			r.PullFailure.Image = cleanImage(NormalizeImage(c.Image))
		}
		out = append(out, r)
	}
	return out
}

// podStatusEvent is the Event a container's waiting status stands for, as
// kubelet would have written it about the container (source pod_status):
// resourceVersion "<pod rv>/<container>" so each container's status is its
// own occurrence, reporting component eventpipe-agent, and the time it was
// observed.
func podStatusEvent(p *Pod, c *Container, observedAt time.Time) (*Event, time.Time) {
	fp := "spec.containers{" + c.Name + "}"
	if c.Init {
		fp = "spec.initContainers{" + c.Name + "}"
	}
	reason, msg := c.WaitingReason, c.WaitingMessage
	if reason == "" && c.Terminated {
		// A terminated container waits for nothing: its termination is
		// the reason ("container agent terminated: OOMKilled (exit code
		// 137)").
		reason = c.TerminatedReason
		if reason == "" {
			reason = "Terminated"
		}
		msg = "container " + c.Name + " terminated: " + reason + " (exit code " + strconv.Itoa(int(c.TerminatedExitCode)) + ")"
	}
	ev := &Event{
		APIVersion:      "v1",
		Namespace:       p.Namespace,
		Name:            p.Name, // names the occurrence only when the pod has no uid
		UID:             p.UID,
		ResourceVersion: p.ResourceVersion + "/" + c.Name,
		Involved: ObjectRef{
			Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID, FieldPath: fp,
		},
		Type:               "Warning",
		Reason:             reason,
		Message:            msg,
		Count:              1,
		ReportingComponent: "eventpipe-agent",
	}
	if ev.Message == "" {
		ev.Message = "container " + c.Name + " is waiting: " + reason
	}
	at := observedAt
	if !validTime(at) {
		at = OccurrenceTime(ev, observedAt)
	}
	return ev, at
}

package enrich

import (
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// A readiness or startup probe that passes again writes no Event, and the
// kubelet restarts nothing, so no Started says that its blocker is over.
// The pod status does: the container's ready flag. BecameReady and
// ContainersReady turn it into the container readiness occurrence (see
// eventpipev1.ContainerReadyEventIDPrefix); pastProbe keeps a probe
// failure from opening a blocker the status already shows is over.

// becameReady reports whether container c of cur is one the occurrence is
// for: it has a readiness or startup probe (no other container can have a
// probe blocker that needs this end), it is ready, and old (the previous
// version of the pod the caller saw, nil at first sight) did not show it
// ready.
func becameReady(old *Pod, c *Container) bool {
	if !c.Probed || !c.Ready {
		return false
	}
	if old == nil {
		return true
	}
	for i := range old.Containers {
		if o := &old.Containers[i]; o.Name == c.Name && o.Init == c.Init {
			return !o.Ready
		}
	}
	return true
}

// BecameReady reports whether ContainersReady(old, cur) may write
// something: a container of cur with a readiness or startup probe is ready
// and was not in old (nil: cur is seen for the first time). A loop over
// the containers, no allocation: informer handlers may call it on every
// pod update. A pod that is another object than old (another uid) is seen
// for the first time.
func BecameReady(old, cur *Pod) bool {
	if cur == nil {
		return false
	}
	if old != nil && old.UID != cur.UID {
		old = nil
	}
	for i := range cur.Containers {
		if becameReady(old, &cur.Containers[i]) {
			return true
		}
	}
	return false
}

// ContainersReady returns the container readiness occurrences of cur's
// containers that BecameReady: one per container, attributed like an
// Event about the container (involved_object the pod, field path
// spec.containers{name} or spec.initContainers{name}), type Normal, reason
// eventpipev1.ReasonContainerReady, reporting_component
// eventpipev1.ComponentAgent, at observedAt, event_id
// "container-ready/<pod uid>/<resourceVersion>/<container>"
// ("container-ready/nouid/<namespace>/<pod name>/<resourceVersion>/<container>"
// for a pod without uid). Only pods attributed to a sandbox get them
// (elsewhere in a cluster readiness is none of eventpipe's business, and
// no probe blocker is tracked there); nil otherwise.
func (e *Enricher) ContainersReady(old, cur *Pod, observedAt time.Time) []*eventpipev1.Occurrence {
	if cur == nil {
		return nil
	}
	if old != nil && old.UID != cur.UID {
		old = nil
	}
	at := observedAt
	if !validTime(at) {
		at = time.Now()
	}
	var out []*eventpipev1.Occurrence
	for i := range cur.Containers {
		c := &cur.Containers[i]
		if !becameReady(old, c) {
			continue
		}
		fp := "spec.containers{" + c.Name + "}"
		if c.Init {
			fp = "spec.initContainers{" + c.Name + "}"
		}
		ev := &Event{
			APIVersion:      "v1",
			Namespace:       cur.Namespace,
			Name:            cur.Name,
			UID:             cur.UID,
			ResourceVersion: cur.ResourceVersion + "/" + c.Name,
			Involved: ObjectRef{
				Kind: "Pod", APIVersion: "v1", Namespace: cur.Namespace, Name: cur.Name, UID: cur.UID, FieldPath: fp,
			},
			Type:               "Normal",
			Reason:             eventpipev1.ReasonContainerReady,
			Message:            "container " + c.Name + " is ready",
			Count:              1,
			ReportingComponent: eventpipev1.ComponentAgent,
		}
		// Not the Event source: no blocker is read from it.
		o := e.enrich(ev, at, eventpipev1.PullSourcePodStatus, false)
		if o.GetSandbox() == nil {
			return nil // the pod is no sandbox's: neither are its other containers
		}
		f := [...]string{cur.UID, cur.ResourceVersion, cur.Namespace, cur.Name, c.Name}
		cleanFields(f[:])
		if f[0] != "" {
			o.EventId = eventpipev1.ContainerReadyEventIDPrefix + f[0] + "/" + f[1] + "/" + f[4]
		} else {
			o.EventId = eventpipev1.ContainerReadyEventIDPrefix + "nouid/" + f[2] + "/" + f[3] + "/" + f[1] + "/" + f[4]
		}
		o.Event = &eventpipev1.EventRef{Uid: f[0], ResourceVersion: f[1], ApiVersion: "v1"}
		out = append(out, o)
	}
	return out
}

// pastProbe reports whether the cached pod shows container past the probe
// a lasting readiness or startup failure is about: ready (a readiness
// probe that fails now and then below its failureThreshold, or a failure
// reported after the container became ready again), or, for a startup
// probe, started. Such a failure opens no blocker: nothing would end it,
// since the ready flag it waits for is already there. Liveness failures
// are judged by the restarts they cause (Started ends them), and without
// a cached pod nothing is known.
func pastProbe(cause string, pod *Pod, container string) bool {
	if pod == nil || container == "" {
		return false
	}
	c := findContainer(pod, container)
	if c == nil {
		return false
	}
	switch cause {
	case eventpipev1.BlockerReadinessProbe:
		return c.Ready
	case eventpipev1.BlockerStartupProbe:
		return c.Started || c.Ready
	}
	return false
}

package diagnosis

import (
	"strings"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Blockers other than image pulls come as Occurrence.blocker, diagnosed by
// the agent's enricher (kind, cause, object, attempts, disposition, fix).
// The folder keeps the latest per (kind, involved object, container) and
// ends it when an event shows the pod got past that stage (see doc.go).

// openBlocker opens or updates the blocker an occurrence's diagnosis names.
func (s *sandboxState) openBlocker(cursor uint64, o *eventpipev1.Occurrence, bl *eventpipev1.Blocker) bool {
	obj := o.GetInvolvedObject()
	key := blockerKey{bl.GetKind(), obj.GetNamespace(), obj.GetKind(), obj.GetName(), bl.GetContainer()}
	last := o.GetOccurredAt().AsTime()
	if t := bl.GetLastSeen(); t != nil {
		last = t.AsTime()
	}
	if t, ok := s.ended[key]; ok && notBefore(t, last) {
		return false // not later than the event that ended it, to the second
	}
	b := s.blockers[key]
	if b == nil {
		if len(s.blockers) >= maxBlockersPerSandbox {
			s.d.DroppedBlockers++
			return false
		}
		b = &Blocker{Kind: key.kind, Namespace: key.namespace, Container: key.container}
		if key.objKind == "Pod" {
			b.Pod = key.pod
		} else {
			b.Involved = key.objKind + "/" + key.pod
		}
		s.blockers[key] = b
	}
	old := *b
	// An "unknown" cause never overwrites a known one of the same blocker.
	if c := bl.GetCause(); c != "" && (c != eventpipev1.BlockerUnknown || b.Cause == "") {
		b.Cause = c
		setIf(&b.Detail, bl.GetDetail())
		setIf(&b.Object, bl.GetObject())
		setIf(&b.Remedy, bl.GetFix())
		if c == eventpipev1.BlockerUnrecognised {
			b.Remedy = "" // no fix: an older cause's would mislead
		}
		b.DecidedBy, b.Confidence = bl.GetDecidedBy(), bl.GetConfidence()
	}
	setIf(&b.Role, o.GetRole())
	if o.GetReportingComponent() == "kubelet" {
		setIf(&b.Node, o.GetReportingInstance())
	}
	setIf(&b.Disposition, bl.GetDisposition())
	b.Attempts = max(b.Attempts, bl.GetAttempts())
	if t := bl.GetFirstSeen(); t != nil && (b.Since.IsZero() || t.AsTime().Before(b.Since)) {
		b.Since = t.AsTime()
	}
	if last.After(b.LastSeen) {
		b.LastSeen = last
	}
	if b.Since.IsZero() {
		b.Since = b.LastSeen
	}
	if bl.GetHasExitCode() {
		v := bl.GetExitCode()
		b.ExitCode = &v
	}
	b.EventID = o.GetEventId()
	b.Cursor = cursor
	// A crash reported after the container's last Started (to the second)
	// keeps it blocked.
	if t, ok := s.started[key]; ok && !notBefore(t, last) {
		delete(s.started, key)
	}
	return !sameBlocker(old, *b)
}

// sameBlocker: equal but for the latest event and cursor (not a change
// worth redrawing).
func sameBlocker(a, b Blocker) bool {
	if (a.ExitCode == nil) != (b.ExitCode == nil) || a.ExitCode != nil && *a.ExitCode != *b.ExitCode {
		return false
	}
	a.ExitCode, b.ExitCode = nil, nil
	a.EventID, a.Cursor = b.EventID, b.Cursor
	return a == b
}

// crashed: causes of a container that started and then died; a Started
// alone does not end them (the kubelet starts a crash-looping container
// again and again), only a Started that settles.
func crashed(cause string) bool {
	switch cause {
	case eventpipev1.BlockerCrashLoop, eventpipev1.BlockerOOMKilled, eventpipev1.BlockerExitError, eventpipev1.BlockerUnknown:
		return true
	}
	return false
}

// endsWithReady: causes the agent's container readiness occurrence ends.
// A ready container passes its readiness probe and has passed its startup
// probe; a liveness failure is not ended by readiness (the container may
// be ready and still fail it), only by the restart it causes.
func endsWithReady(cause string) bool {
	return cause == eventpipev1.BlockerReadinessProbe || cause == eventpipev1.BlockerStartupProbe
}

// closeBlockers ends the non-image blockers o shows are over (see doc.go);
// only blockers last seen no later than o end, to the second: a kubelet
// Event's time has whole seconds while a pod status is stamped with the
// agent's clock, so a status observed in the second of the Started that
// followed it cannot be ordered against it, and the Started wins the tie (as
// a Pulled does for pulls). A crash after it is reported again (the
// kubelet's BackOff, the next status) and blocks again.
func (s *sandboxState) closeBlockers(o *eventpipev1.Occurrence, at time.Time) bool {
	obj := o.GetInvolvedObject()
	ns, kind, name := obj.GetNamespace(), obj.GetKind(), obj.GetName()
	closed := false
	end := func(match func(k blockerKey, b *Blocker) bool) {
		for k, b := range s.blockers {
			if k.kind != KindImagePull && match(k, b) && notBefore(at, b.LastSeen) {
				delete(s.blockers, k)
				delete(s.started, k)
				if len(s.ended) >= maxBlockersPerSandbox {
					clear(s.ended) // bounded; forgetting only lets a late report reopen it
				}
				s.ended[k] = at
				closed = true
			}
		}
	}
	samePod := func(k blockerKey) bool {
		return kind == "Pod" && k.objKind == "Pod" && k.namespace == ns && k.pod == name
	}
	sameObj := func(k blockerKey) bool { return k.objKind == kind && k.namespace == ns && k.pod == name }
	if eventpipev1.IsSandboxCondition(o) {
		// The Sandbox's Ready condition no longer says the API server
		// refuses its pod (the Agent Sandbox controller writes no Event
		// when the pod goes through).
		end(func(k blockerKey, _ *Blocker) bool {
			return k.kind == eventpipev1.BlockerKindCreateRefused && sameObj(k)
		})
	}
	if eventpipev1.IsContainerReady(o) {
		// The container's readiness (or startup) probe passes again: no
		// Event says so and nothing restarts, so the agent's occurrence
		// is the only end. Liveness failures restart the container and
		// end with its Started.
		c := o.GetContainer()
		end(func(k blockerKey, b *Blocker) bool {
			return k.kind == eventpipev1.BlockerKindContainer && samePod(k) && k.container == c && endsWithReady(b.Cause)
		})
		return closed
	}
	switch reason := o.GetReason(); reason {
	case "Scheduled":
		if kind != "Pod" {
			break
		}
		end(func(k blockerKey, _ *Blocker) bool {
			switch k.kind {
			case eventpipev1.BlockerKindUnschedulable:
				return samePod(k)
			case eventpipev1.BlockerKindCreateRefused:
				// The sandbox has its workload pod: its creation went
				// through (the supervisor pod is not the refused one).
				return o.GetRole() != eventpipev1.RoleSupervisor
			case eventpipev1.BlockerKindVolume:
				// The scheduler binds a pod only once its claims are bound;
				// the workspace claim is the workload pod's.
				return k.objKind == "PersistentVolumeClaim" && o.GetRole() != eventpipev1.RoleSupervisor
			}
			return false
		})
	case "ProvisioningSucceeded":
		end(func(k blockerKey, _ *Blocker) bool { return k.kind == eventpipev1.BlockerKindVolume && sameObj(k) })
	case "SuccessfulAttachVolume":
		end(func(k blockerKey, b *Blocker) bool {
			return k.kind == eventpipev1.BlockerKindVolume && samePod(k) && b.Cause == eventpipev1.BlockerAttachFailed
		})
	case "SuccessfulMountVolume":
		end(func(k blockerKey, _ *Blocker) bool { return k.kind == eventpipev1.BlockerKindVolume && samePod(k) })
	case "SuccessfulCreate", "PodCreated":
		// SuccessfulCreate: the workload controllers; PodCreated: the
		// sandbox controller.
		end(func(k blockerKey, _ *Blocker) bool {
			return k.kind == eventpipev1.BlockerKindCreateRefused && sameObj(k)
		})
	case "Pulling", "Pulled", "Created", "Started":
		// The kubelet pulls and starts containers only on a node, with
		// the pod's volumes mounted.
		end(func(k blockerKey, _ *Blocker) bool {
			return (k.kind == eventpipev1.BlockerKindVolume || k.kind == eventpipev1.BlockerKindUnschedulable) && samePod(k)
		})
		if reason != "Started" {
			break
		}
		c := o.GetContainer()
		end(func(k blockerKey, b *Blocker) bool {
			return k.kind == eventpipev1.BlockerKindContainer && samePod(k) && k.container == c && !crashed(b.Cause)
		})
		for k, b := range s.blockers {
			if k.kind == eventpipev1.BlockerKindContainer && samePod(k) && k.container == c && notBefore(at, b.LastSeen) {
				s.started[k] = at
			}
		}
	}
	return closed
}

// settle ends the crash blockers whose container has stayed up since its
// Started for settle, with no later crash.
func (f *Folder) settle() {
	now := time.Now()
	if f.Now != nil {
		now = f.Now()
	}
	settle := f.CrashSettle
	if settle <= 0 {
		settle = DefaultCrashSettle
	}
	for _, s := range f.sandboxes {
		if len(s.started) == 0 {
			continue
		}
		changed := false
		for k, t := range s.started {
			if now.Sub(t) >= settle {
				delete(s.started, k)
				delete(s.blockers, k)
				changed = true
			}
		}
		if changed {
			s.refresh()
		}
	}
}

// stage orders blockers by how far the pod got: creation, its claims bound,
// scheduling, volumes attached and mounted, image pulls, containers. The
// earliest stage is what to fix first: the later ones cannot even be tried
// before it (a pod whose claim is unbound is unschedulable because of it).
func stage(b Blocker) int {
	switch b.Kind {
	case eventpipev1.BlockerKindCreateRefused:
		return 0
	case eventpipev1.BlockerKindVolume:
		if strings.HasPrefix(b.Involved, "PersistentVolumeClaim/") {
			return 1
		}
		return 3
	case eventpipev1.BlockerKindUnschedulable:
		return 2
	case KindImagePull:
		return 4
	case eventpipev1.BlockerKindContainer:
		return 5
	}
	return 6
}

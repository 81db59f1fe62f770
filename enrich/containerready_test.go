package enrich

import (
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// readyPod is the seed's workload pod running, its agent container with a
// readiness probe (ready as given) and its supervisor sidecar without one.
func readyPod(rv string, agentReady bool) *Pod {
	p := seedPod()
	p.ResourceVersion, p.Phase = rv, "Running"
	for i := range p.Containers {
		c := &p.Containers[i]
		c.WaitingReason, c.WaitingMessage = "", ""
		switch c.Name {
		case "agent":
			c.Probed, c.Ready, c.Started = true, agentReady, true
		case "openshell-supervisor-network":
			c.Ready, c.Started = true, true
		}
	}
	return p
}

// TestBecameReady: the transitions the informer handler queues. Only a
// probed container that is ready now and was not in the version before
// (or is seen for the first time) counts; a repeated update of a ready
// pod, a container without a readiness or startup probe, and a container
// going unready do not.
func TestBecameReady(t *testing.T) {
	other := readyPod("5", false)
	other.UID = "another-pod"
	for _, tc := range []struct {
		name     string
		old, cur *Pod
		want     bool
	}{
		{"not ready to ready", readyPod("5", false), readyPod("6", true), true},
		{"ready again: a repeated update", readyPod("6", true), readyPod("7", true), false},
		{"ready to not ready", readyPod("6", true), readyPod("7", false), false},
		{"still not ready", readyPod("5", false), readyPod("6", false), false},
		{"first sight, ready", nil, readyPod("6", true), true},
		{"first sight, not ready", nil, readyPod("6", false), false},
		{"another pod under the name: first sight", other, readyPod("6", true), true},
		{"no current pod", readyPod("5", false), nil, false},
	} {
		if got := BecameReady(tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: BecameReady = %v, want %v", tc.name, got, tc.want)
		}
	}
	// A container without a readiness or startup probe is never one.
	unprobed := readyPod("6", true)
	unprobed.Containers[4].Probed = false
	if BecameReady(nil, unprobed) || BecameReady(readyPod("5", false), unprobed) {
		t.Errorf("a container without readiness or startup probe counts")
	}
}

// TestContainersReady: the occurrence of a sandbox pod's probed container
// that became ready, as readers need it to end the container's probe
// blockers: the agent's, about the pod and that container, attributed,
// and named by the pod version; none for another pod of the cluster, none
// for a repeated update.
func TestContainersReady(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	at := t0.Add(time.Minute)
	got := e.ContainersReady(readyPod("5", false), readyPod("6", true), at)
	if len(got) != 1 {
		t.Fatalf("%d occurrences, want 1: %v", len(got), got)
	}
	o := got[0]
	if !eventpipev1.IsContainerReady(o) || o.GetEventId() != "container-ready/"+seedPodUID+"/6/agent" ||
		o.GetType() != "Normal" || o.GetReason() != eventpipev1.ReasonContainerReady || o.GetReportingComponent() != eventpipev1.ComponentAgent ||
		o.GetContainer() != "agent" || o.GetInvolvedObject().GetKind() != "Pod" || o.GetInvolvedObject().GetName() != "img-missing" ||
		o.GetInvolvedObject().GetFieldPath() != "spec.containers{agent}" || o.GetBlocker() != nil || o.GetPullFailure() != nil {
		t.Errorf("occurrence %v", o)
	}
	if o.GetSandbox().GetId() != seedID || o.GetAttribution() != eventpipev1.AttributionPodAnnotation || o.GetRole() != eventpipev1.RoleWorkload {
		t.Errorf("attributed to %v by %s as %s", o.GetSandbox(), o.GetAttribution(), o.GetRole())
	}
	if !o.GetOccurredAt().AsTime().Equal(at) || o.GetEvent().GetUid() != seedPodUID || o.GetEvent().GetResourceVersion() != "6" {
		t.Errorf("at %v, event %v", o.GetOccurredAt().AsTime(), o.GetEvent())
	}
	if got := e.ContainersReady(readyPod("6", true), readyPod("7", true), at); got != nil {
		t.Errorf("a repeated update wrote %v", got)
	}
	// Another pod of the cluster: its readiness is none of eventpipe's
	// business.
	plain := &Pod{Meta: Meta{Namespace: "kube-system", Name: "coredns-7db6d8ff4d-x", UID: "dns-uid", ResourceVersion: "9"},
		Containers: []Container{{Name: "coredns", Probed: true, Ready: true, Started: true}}}
	if got := e.ContainersReady(nil, plain, at); got != nil {
		t.Errorf("a pod of no sandbox: %v", got)
	}
	// Without uid the pod is named by namespace, name and version; an init
	// container (a sidecar) by its field path.
	p := readyPod("8", true)
	p.UID = ""
	p.Containers[0].Probed, p.Containers[0].Ready = true, true
	got = e.ContainersReady(nil, p, at)
	if len(got) != 2 || got[0].GetEventId() != "container-ready/nouid/"+seedNS+"/img-missing/8/openshell-sandbox-bootstrap" ||
		got[0].GetInvolvedObject().GetFieldPath() != "spec.initContainers{openshell-sandbox-bootstrap}" ||
		got[1].GetEventId() != "container-ready/nouid/"+seedNS+"/img-missing/8/agent" {
		t.Errorf("without uid: %v", got)
	}
}

// TestProbeFailurePastItsContainer: a readiness failure about a container
// the cached pod shows ready (a probe failing now and then below its
// failureThreshold, or a failure read after the container recovered), or
// a startup failure about one that shows started, opens no blocker:
// nothing would end it. The same failures about a container that is not
// ready are blockers, and a liveness failure is one whatever the ready
// flag says (its end is the restart).
func TestProbeFailurePastItsContainer(t *testing.T) {
	for _, tc := range []struct {
		name, msg      string
		ready, started bool
		wantBlocker    bool
	}{
		{"readiness, not ready", "Readiness probe failed: cat: can't open '/tmp/ready': No such file or directory", false, true, true},
		{"readiness, ready", "Readiness probe failed: cat: can't open '/tmp/ready': No such file or directory", true, true, false},
		{"startup, not started", "Startup probe failed: cat: can't open '/tmp/started': No such file or directory", false, false, true},
		{"startup, started", "Startup probe failed: cat: can't open '/tmp/started': No such file or directory", false, true, false},
		{"liveness, ready", "Liveness probe failed: HTTP probe failed with statuscode: 503", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := seedWorld()
			p := readyPod("6", tc.ready)
			p.Containers[4].Started = tc.started
			w.addPod(p)
			e := mustNew(t, NewDefaultConfig(), w.lookups())
			ev := podEvent("img-missing", "spec.containers{agent}", "Unhealthy", tc.msg)
			ev.Type, ev.Count = "Warning", 5
			if b := e.Enrich(ev, t0).Occurrence.GetBlocker(); (b != nil) != tc.wantBlocker {
				t.Errorf("blocker %v, want one: %v", b, tc.wantBlocker)
			}
		})
	}
}

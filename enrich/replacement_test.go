package enrich

import (
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// The sandbox img-missing (seedID) was deleted and OpenShell created it
// again under the same name: a new id, a new CR and a new pod, both with the
// old ones' names. The old pod's kubelet Events keep arriving; they name the
// old pod by uid.
const (
	newID     = "9c4b7f0e-3a5d-4e21-b8c7-1d2e3f4a5b6c"
	newCRUID  = "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"
	newPodUID = "1f2e3d4c-5b6a-4798-8a9b-0c1d2e3f4a5b"
)

// deletedAt is when the agent saw the old CR and pod deleted.
var deletedAt = t0.Add(10 * time.Minute)

// replacedWorld: the new CR and pod are cached under the names; the old
// ones are remembered by uid only (tombstones), when tombstones is set.
type replacedWorld struct {
	*maps
	oldPods map[string]*Pod
}

func (w *replacedWorld) PodByUID(uid string) (*Pod, bool) { p, ok := w.oldPods[uid]; return p, ok }
func (w *replacedWorld) lookups() Lookups {
	return Lookups{Pods: w, PVCs: w.maps, Namespaces: w.maps, Sandboxes: w.maps}
}

func newReplacedWorld(tombstones bool) *replacedWorld {
	m := newMaps()
	m.addNS(managedNamespace())
	oldCR, oldPod := seedCR(true), seedPod()
	oldCR.DeletedAt, oldPod.DeletedAt = deletedAt, deletedAt

	newCR := seedCR(true)
	newCR.UID = newCRUID
	for _, p := range []*Pairs{&newCR.Labels, &newCR.Annotations} {
		*p = replaceValue(*p, seedID, newID)
	}
	pod := seedPod()
	pod.UID = newPodUID
	pod.Annotations = PairsOf(map[string]string{"openshell.ai/sandbox-id": newID})
	pod.Labels = replaceValue(pod.Labels, seedID, newID)
	pod.Owners = []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "img-missing", UID: newCRUID, Controller: true}}
	pod.Containers[3].WaitingReason, pod.Containers[3].WaitingMessage = "", ""

	w := &replacedWorld{maps: m, oldPods: map[string]*Pod{}}
	if tombstones {
		m.byUID[seedCRUID] = oldCR
		w.oldPods[seedPodUID] = oldPod
	}
	m.addSandbox(newCR)
	m.addPod(pod)
	m.addPVC(&PVC{Meta: Meta{Namespace: seedNS, Name: "workspace-img-missing", UID: "new-pvc-uid",
		Owners: []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "img-missing", UID: newCRUID, Controller: true}}}})
	return w
}

func replaceValue(p Pairs, from, to string) Pairs {
	out := make(Pairs, len(p))
	for i, kv := range p {
		if kv.Value == from {
			kv.Value = to
		}
		out[i] = kv
	}
	return out
}

// No Event of the old sandbox is attributed to its replacement: with the
// old objects remembered it goes to the old id (marked deleted), without
// them it is held (missing) and would ship unattributed; an Event of the
// new pod goes to the new id.
func TestReplacedSandboxEventsKeepTheirID(t *testing.T) {
	failed := func(uid string) *Event {
		ev := podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed)
		ev.Type, ev.Involved.UID = "Warning", uid
		return ev
	}
	crEvent := func(uid string) *Event {
		return &Event{APIVersion: "v1", Namespace: seedNS, Name: "img-missing.1", UID: "ev-cr", ResourceVersion: "1",
			Involved: ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Namespace: seedNS, Name: "img-missing", UID: uid},
			Type:     "Normal", Reason: "PodCreated", Message: "Created Pod img-missing", Count: 1, LastTimestamp: t0}
	}
	pvcEvent := func(uid string) *Event {
		return &Event{APIVersion: "v1", Namespace: seedNS, Name: "workspace-img-missing.1", UID: "ev-pvc", ResourceVersion: "1",
			Involved: ObjectRef{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: seedNS, Name: "workspace-img-missing", UID: uid},
			Type:     "Warning", Reason: "ProvisioningFailed", Message: "storageclass.storage.k8s.io \"fast\" not found", Count: 1, LastTimestamp: t0}
	}
	tests := []struct {
		name        string
		tombstones  bool
		ev          *Event
		wantID      string
		wantDeleted bool
		wantMissing bool
	}{
		{"old pod, remembered", true, failed(seedPodUID), seedID, true, false},
		{"old pod, forgotten", false, failed(seedPodUID), "", false, true},
		{"new pod", true, failed(newPodUID), newID, false, false},
		{"pod event without uid takes the cached pod", true, failed(""), newID, false, false},
		{"old CR, remembered", true, crEvent(seedCRUID), seedID, true, false},
		{"old CR, forgotten", false, crEvent(seedCRUID), "", false, true},
		{"new CR", true, crEvent(newCRUID), newID, false, false},
		{"old claim", true, pvcEvent("old-pvc-uid"), "", false, true},
		{"new claim", true, pvcEvent("new-pvc-uid"), newID, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, NewDefaultConfig(), newReplacedWorld(tc.tombstones).lookups())
			res := e.Enrich(tc.ev, t0)
			sb := res.Occurrence.GetSandbox()
			if sb.GetId() != tc.wantID || res.Missing != tc.wantMissing {
				t.Fatalf("sandbox id %q missing %v (rule %s), want %q missing %v", sb.GetId(), res.Missing,
					res.Occurrence.GetAttribution(), tc.wantID, tc.wantMissing)
			}
			if got := sb.GetDeletedAt() != nil; got != tc.wantDeleted {
				t.Errorf("deleted_at %v, want set=%v", sb.GetDeletedAt(), tc.wantDeleted)
			}
			if tc.wantDeleted && !sb.GetDeletedAt().AsTime().Equal(deletedAt) {
				t.Errorf("deleted_at %v, want %v", sb.GetDeletedAt().AsTime(), deletedAt)
			}
		})
	}
}

// The old pod's pull failures count for the old pod only: the new pod's
// first failure is attempt 1, not the old pod's count plus one.
func TestReplacedSandboxStartsAFreshPullHistory(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), newReplacedWorld(true).lookups())
	for i := range 4 {
		ev := podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed)
		ev.Involved.UID, ev.UID, ev.Count = seedPodUID, "ev-old", int32(i+1)
		e.Enrich(ev, t0)
	}
	ev := podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed)
	ev.Involved.UID, ev.UID = newPodUID, "ev-new"
	o := e.Enrich(ev, t0).Occurrence
	if o.GetSandbox().GetId() != newID || o.GetPullFailure().GetAttempts() != 1 {
		t.Fatalf("new pod's first failure: sandbox %s attempts %d, want %s and 1", o.GetSandbox().GetId(), o.GetPullFailure().GetAttempts(), newID)
	}
}

// The deletion occurrence names the old sandbox, is marked deleted, and
// has a stable event_id.
func TestSandboxDeleted(t *testing.T) {
	w := newReplacedWorld(true)
	e := mustNew(t, NewDefaultConfig(), w.lookups())
	cr := seedCR(false)
	o := e.SandboxDeleted(cr, deletedAt)
	if o == nil {
		t.Fatal("no deletion occurrence")
	}
	sb := o.GetSandbox()
	if sb.GetId() != seedID || sb.GetName() != "img-missing" || sb.GetWorkspace() != "repro" || sb.GetGatewayId() != "openshell" ||
		!sb.GetDeletedAt().AsTime().Equal(deletedAt) || !eventpipev1.IsSandboxDeletion(o) ||
		o.GetEventId() != "sandbox-deleted/"+seedCRUID || o.GetInvolvedObject().GetUid() != seedCRUID ||
		o.GetRole() != eventpipev1.RoleSandbox || o.GetAttribution() != eventpipev1.AttributionSandboxAnnotation {
		t.Fatalf("deletion occurrence: %v", o)
	}
	if again := e.SandboxDeleted(cr, deletedAt.Add(time.Minute)); again.GetEventId() != o.GetEventId() {
		t.Errorf("the same deletion seen again: event_id %s, want %s", again.GetEventId(), o.GetEventId())
	}
	foreign := &Sandbox{Meta: Meta{Namespace: "x", Name: "y", UID: "z"}}
	if got := e.SandboxDeleted(foreign, deletedAt); got != nil {
		t.Errorf("a CR without sandbox id: %v", got)
	}
	// A Kubernetes Event that uses the reason is no deletion.
	ev := podEvent("img-missing", "", eventpipev1.ReasonSandboxDeleted, "x")
	if eventpipev1.IsSandboxDeletion(e.Enrich(ev, t0).Occurrence) {
		t.Error("an Event with reason SandboxDeleted taken for the agent's deletion")
	}
}

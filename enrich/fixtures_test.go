package enrich

import (
	"time"
)

// maps is a test Lookups backed by maps.
type nsName struct{ ns, name string }

type maps struct {
	pods       map[nsName]*Pod
	pvcs       map[nsName]*PVC
	namespaces map[string]*Namespace
	sandboxes  map[nsName]*Sandbox
	byUID      map[string]*Sandbox
}

func newMaps() *maps {
	return &maps{pods: map[nsName]*Pod{}, pvcs: map[nsName]*PVC{}, namespaces: map[string]*Namespace{}, sandboxes: map[nsName]*Sandbox{}, byUID: map[string]*Sandbox{}}
}

func (m *maps) Pod(ns, name string) (*Pod, bool) { p, ok := m.pods[nsName{ns, name}]; return p, ok }
func (m *maps) PVC(ns, name string) (*PVC, bool) { p, ok := m.pvcs[nsName{ns, name}]; return p, ok }
func (m *maps) Namespace(name string) (*Namespace, bool) {
	n, ok := m.namespaces[name]
	return n, ok
}
func (m *maps) Sandbox(ns, name string) (*Sandbox, bool) {
	s, ok := m.sandboxes[nsName{ns, name}]
	return s, ok
}
func (m *maps) SandboxByUID(uid string) (*Sandbox, bool) {
	s, ok := m.byUID[uid]
	return s, ok
}
func (m *maps) lookups() Lookups { return Lookups{Pods: m, PVCs: m, Namespaces: m, Sandboxes: m} }

func (m *maps) addPod(p *Pod)      { m.pods[nsName{p.Namespace, p.Name}] = p }
func (m *maps) addPVC(p *PVC)      { m.pvcs[nsName{p.Namespace, p.Name}] = p }
func (m *maps) addNS(n *Namespace) { m.namespaces[n.Name] = n }
func (m *maps) addSandbox(s *Sandbox) {
	m.sandboxes[nsName{s.Namespace, s.Name}] = s
	if s.UID != "" {
		m.byUID[s.UID] = s
	}
}

// Object shapes from the image-pull seed (OpenShell 0.1.6, managed mode,
// Helm-default gateway id "openshell").
const (
	seedNS        = "openshell-openshell-repro"
	seedID        = "2ff21e26-1a7b-49a2-a640-14ae153f93ea"
	seedCRUID     = "876414ec-8379-42b9-8deb-a047f4214891"
	seedPodUID    = "d9710c1d-2d01-4940-95b4-71b07f1976ff"
	seedImage     = "docker.io/library/busybox:0.0.0-does-not-exist"
	seedBootImage = "ghcr.io/nvidia/openshell/sandbox:0.1.6"
	seedSupImage  = "ghcr.io/nvidia/openshell/supervisor:0.1.6"
	seedSupPod    = "os-supervisor-" + seedID
	seedBackOff   = `Back-off pulling image "docker.io/library/busybox:0.0.0-does-not-exist": ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
	seedFailed    = `Failed to pull image "docker.io/library/busybox:0.0.0-does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
)

var t0 = time.Date(2026, 10, 29, 10, 10, 36, 0, time.UTC)

func managedNamespace() *Namespace {
	return &Namespace{Meta: Meta{Name: seedNS, UID: "ns-uid", Labels: PairsOf(map[string]string{
		"openshell.ai/managed-by": "openshell", "openshell.ai/gateway-id": "openshell", "openshell.ai/sandbox-workspace": "repro",
	})}}
}

// seedCR is the img-missing Sandbox CR; withLabels=false drops the
// workspace so the namespace rule has to supply it.
func seedCR(withWorkspace bool) *Sandbox {
	labels := map[string]string{"openshell.ai/sandbox-id": seedID, "openshell.ai/sandbox-name": "img-missing", "openshell.ai/managed-by": "openshell"}
	ann := map[string]string{"openshell.ai/sandbox-id": seedID, "openshell.ai/sandbox-name": "img-missing"}
	if withWorkspace {
		labels["openshell.ai/sandbox-workspace"] = "repro"
		ann["openshell.ai/sandbox-workspace"] = "repro"
		labels["openshell.ai/gateway-id"] = "openshell"
	}
	return &Sandbox{Meta: Meta{Namespace: seedNS, Name: "img-missing", UID: seedCRUID, Labels: PairsOf(labels), Annotations: PairsOf(ann)},
		APIVersion: "agents.x-k8s.io/v1beta1", PodName: "img-missing"}
}

func crOwner(controller bool) []Owner {
	return []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "img-missing", UID: seedCRUID, Controller: controller}}
}

// seedPod is the img-missing workload pod (newer generation) in
// Init:ImagePullBackOff.
func seedPod() *Pod {
	return &Pod{
		Meta: Meta{Namespace: seedNS, Name: "img-missing", UID: seedPodUID, ResourceVersion: "5302",
			Labels:      PairsOf(map[string]string{"agents.x-k8s.io/sandbox-name-hash": "6f9c2d1e", "openshell.ai/boundary-pair": seedID, "openshell.ai/boundary-role": "workload"}),
			Annotations: PairsOf(map[string]string{"openshell.ai/sandbox-id": seedID}),
			Owners:      crOwner(true)},
		NodeName: "osrepro-control-plane", Phase: "Pending",
		Containers: []Container{
			{Name: "openshell-sandbox-bootstrap", Image: seedBootImage, Init: true},
			{Name: "openshell-supervisor-install", Image: seedSupImage, Init: true},
			{Name: "openshell-network-init", Image: seedSupImage, Init: true},
			{Name: "workspace-init", Image: seedImage, Init: true, WaitingReason: "ImagePullBackOff", WaitingMessage: seedBackOff},
			{Name: "agent", Image: seedImage, WaitingReason: "PodInitializing"},
			{Name: "openshell-supervisor-network", Image: seedSupImage},
		},
	}
}

func seedSupervisorPod() *Pod {
	return &Pod{
		Meta: Meta{Namespace: seedNS, Name: seedSupPod, UID: "sup-pod-uid", ResourceVersion: "5288",
			Labels: PairsOf(map[string]string{"openshell.ai/managed-by": "openshell", "openshell.ai/sandbox-id": seedID, "openshell.ai/component": "supervisor",
				"openshell.ai/boundary-pair": seedID, "openshell.ai/boundary-role": "supervisor", "openshell.ai/gateway-id": "openshell"}),
			Annotations: PairsOf(map[string]string{"openshell.ai/sandbox-id": seedID}),
			Owners:      crOwner(false)},
		Phase:      "Running",
		Containers: []Container{{Name: "supervisor", Image: seedSupImage}},
	}
}

// seedWorld is the managed-mode seed with everything cached.
func seedWorld() *maps {
	m := newMaps()
	m.addNS(managedNamespace())
	m.addSandbox(seedCR(true))
	m.addPod(seedPod())
	m.addPod(seedSupervisorPod())
	m.addPVC(&PVC{Meta: Meta{Namespace: seedNS, Name: "workspace-img-missing", UID: "pvc-uid", Owners: crOwner(true)}})
	return m
}

func podEvent(pod, fieldPath, reason, msg string) *Event {
	return &Event{
		APIVersion: "v1", Namespace: seedNS, Name: pod + ".18a2f0c1", UID: "ev-" + pod + "-" + reason, ResourceVersion: "1",
		Involved: ObjectRef{Kind: "Pod", APIVersion: "v1", Namespace: seedNS, Name: pod, FieldPath: fieldPath},
		Type:     "Normal", Reason: reason, Message: msg, Count: 1,
		FirstTimestamp: t0, LastTimestamp: t0, ReportingComponent: "kubelet", ReportingInstance: "osrepro-control-plane",
	}
}

func mustNew(t interface{ Fatalf(string, ...any) }, cfg Config, lk Lookups) *Enricher {
	e, err := New(cfg, lk)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

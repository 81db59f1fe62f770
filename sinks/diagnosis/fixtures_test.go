package diagnosis

import (
	"fmt"
	"strings"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// The fixtures are OpenShell objects as a cluster has them (newer
// generation, managed mode) and kubelet Events with the kubelet's and
// containerd's own wording; the real enricher turns them into occurrences,
// so the folding is tested on what the agent really ships.

const (
	gatewayID      = "openshell"
	workspace      = "repro"
	imageMissing   = "docker.io/library/busybox:0.0.0-does-not-exist"
	supervisorBad  = "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"
	supervisorGood = "ghcr.io/nvidia/openshell/supervisor:0.1.4"
	workloadImage  = "ghcr.io/nvidia/openshell/sandbox-base:0.1.4"
	nodeName       = "worker-1"
)

type lookups struct {
	pods      map[string]*enrich.Pod
	sandboxes map[string]*enrich.Sandbox
	ns        map[string]*enrich.Namespace
}

func (l *lookups) Pod(ns, name string) (*enrich.Pod, bool) {
	p, ok := l.pods[ns+"/"+name]
	return p, ok
}
func (l *lookups) Sandbox(ns, name string) (*enrich.Sandbox, bool) {
	s, ok := l.sandboxes[ns+"/"+name]
	return s, ok
}
func (l *lookups) SandboxByUID(uid string) (*enrich.Sandbox, bool) {
	for _, s := range l.sandboxes {
		if s.UID == uid {
			return s, true
		}
	}
	return nil, false
}
func (l *lookups) Namespace(name string) (*enrich.Namespace, bool) { n, ok := l.ns[name]; return n, ok }

// sandbox is one OpenShell sandbox of the fixture.
type sandbox struct {
	id, name, ns                string
	image, supervisorImage      string
	crUID, podUID, supervisorID string
}

func (s sandbox) supervisorPod() string { return "os-supervisor-" + s.id }

// fixture builds the caches for sandboxes and an Enricher over them.
type fixture struct {
	t   testing.TB
	lk  *lookups
	en  *enrich.Enricher
	now time.Time
	seq int
}

func newFixture(t testing.TB, sbs ...sandbox) *fixture {
	lk := &lookups{pods: map[string]*enrich.Pod{}, sandboxes: map[string]*enrich.Sandbox{}, ns: map[string]*enrich.Namespace{}}
	for _, s := range sbs {
		lk.ns[s.ns] = &enrich.Namespace{Meta: enrich.Meta{Name: s.ns, UID: "ns-" + s.id, Labels: enrich.PairsOf(map[string]string{
			"openshell.ai/managed-by": "openshell", "openshell.ai/gateway-id": gatewayID, "openshell.ai/sandbox-workspace": workspace})}}
		ids := map[string]string{"openshell.ai/sandbox-id": s.id, "openshell.ai/sandbox-name": s.name,
			"openshell.ai/sandbox-workspace": workspace}
		crLabels := map[string]string{"openshell.ai/managed-by": "openshell", "openshell.ai/gateway-id": gatewayID}
		for k, v := range ids {
			crLabels[k] = v
		}
		lk.sandboxes[s.ns+"/"+s.name] = &enrich.Sandbox{APIVersion: "agents.x-k8s.io/v1beta1", PodName: s.name,
			Meta: enrich.Meta{Namespace: s.ns, Name: s.name, UID: s.crUID, Labels: enrich.PairsOf(crLabels), Annotations: enrich.PairsOf(ids)}}
		owner := []enrich.Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: s.name, UID: s.crUID, Controller: true}}
		lk.pods[s.ns+"/"+s.name] = &enrich.Pod{NodeName: nodeName, Phase: "Pending",
			Meta: enrich.Meta{Namespace: s.ns, Name: s.name, UID: s.podUID, Owners: owner,
				Annotations: enrich.PairsOf(map[string]string{"openshell.ai/sandbox-id": s.id}),
				Labels:      enrich.PairsOf(map[string]string{"openshell.ai/boundary-pair": s.id, "openshell.ai/boundary-role": "workload"})},
			Containers: []enrich.Container{
				{Name: "openshell-sandbox-bootstrap", Image: s.supervisorImage, Init: true},
				{Name: "workspace-init", Image: s.image, Init: true},
				{Name: "agent", Image: s.image},
			}}
		supOwner := []enrich.Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: s.name, UID: s.crUID}}
		lk.pods[s.ns+"/"+s.supervisorPod()] = &enrich.Pod{NodeName: nodeName, Phase: "Pending",
			Meta: enrich.Meta{Namespace: s.ns, Name: s.supervisorPod(), UID: s.supervisorID, Owners: supOwner,
				Annotations: enrich.PairsOf(map[string]string{"openshell.ai/sandbox-id": s.id}),
				Labels: enrich.PairsOf(map[string]string{"openshell.ai/managed-by": "openshell", "openshell.ai/sandbox-id": s.id,
					"openshell.ai/component": "supervisor", "openshell.ai/boundary-pair": s.id,
					"openshell.ai/boundary-role": "supervisor", "openshell.ai/gateway-id": gatewayID})},
			Containers: []enrich.Container{{Name: "supervisor", Image: s.supervisorImage}}}
	}
	cfg := enrich.NewDefaultConfig()
	cfg.Cluster = "test"
	en, err := enrich.New(cfg, enrich.Lookups{Pods: lk, PVCs: nil, Namespaces: lk, Sandboxes: lk})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, lk: lk, en: en, now: time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)}
}

func newSandbox(n int, name, image, supImage string) sandbox {
	id := fmt.Sprintf("2ff21e26-1a7b-49a2-a640-14ae153f93%02x", n)
	return sandbox{id: id, name: name, ns: "openshell-openshell-" + workspace, image: image, supervisorImage: supImage,
		crUID:  fmt.Sprintf("c0000000-0000-4000-8000-0000000000%02x", n),
		podUID: fmt.Sprintf("p0000000-0000-4000-8000-0000000000%02x", n), supervisorID: fmt.Sprintf("s0000000-0000-4000-8000-0000000000%02x", n)}
}

// kubeletEvent is one core/v1 Event the kubelet writes about a container.
// Repeating the same (pod, container, reason, message) bumps count.
func (f *fixture) kubeletEvent(s sandbox, supervisorPod bool, container, typ, reason, msg string, count int32) *eventpipev1.Occurrence {
	f.t.Helper()
	f.seq++
	f.now = f.now.Add(time.Second)
	pod, uid := s.name, s.podUID
	path := "spec.containers{" + container + "}"
	if supervisorPod {
		pod, uid = s.supervisorPod(), s.supervisorID
	} else if container != "agent" {
		path = "spec.initContainers{" + container + "}"
	}
	key := strings.NewReplacer(" ", "", ":", "", "\"", "").Replace(pod + container + reason + msg)
	if len(key) > 40 {
		key = key[len(key)-40:]
	}
	ev := &enrich.Event{APIVersion: "v1", Namespace: s.ns, Name: pod + "." + fmt.Sprintf("%x", len(key)*7919+int(count)),
		UID: "ev-" + key, ResourceVersion: fmt.Sprint(f.seq),
		Involved: enrich.ObjectRef{Kind: "Pod", APIVersion: "v1", Namespace: s.ns, Name: pod, UID: uid, FieldPath: path},
		Type:     typ, Reason: reason, Message: msg, Count: count,
		FirstTimestamp: f.now.Add(-time.Duration(count) * 10 * time.Second), LastTimestamp: f.now,
		ReportingComponent: "kubelet", ReportingInstance: nodeName}
	r := f.en.Enrich(ev, f.now)
	if r.Missing {
		f.t.Fatalf("fixture event %s %s: not attributable from the caches", pod, reason)
	}
	if r.Occurrence.GetSandbox().GetId() != s.id {
		f.t.Fatalf("fixture event %s %s: attributed to %q, want %s", pod, reason, r.Occurrence.GetSandbox().GetId(), s.id)
	}
	return r.Occurrence
}

// containerdNotFound is containerd 2.x's answer for a tag that does not exist.
func containerdNotFound(image string) string {
	return fmt.Sprintf("rpc error: code = NotFound desc = failed to pull and unpack image %q: failed to resolve reference %q: %s: not found", image, image, image)
}

// pullFailure plays one kubelet pull-failure round for a container
// (Pulling, Failed, ErrImagePull, BackOff, ImagePullBackOff) as round
// number n (1-based: counts grow with n).
func (f *fixture) pullFailure(s sandbox, supervisorPod bool, container, image string, n int32) []*eventpipev1.Occurrence {
	return []*eventpipev1.Occurrence{
		f.kubeletEvent(s, supervisorPod, container, "Normal", "Pulling", fmt.Sprintf("Pulling image %q", image), n),
		f.kubeletEvent(s, supervisorPod, container, "Warning", "Failed", fmt.Sprintf("Failed to pull image %q: %s", image, containerdNotFound(image)), n),
		f.kubeletEvent(s, supervisorPod, container, "Warning", "Failed", "Error: ErrImagePull", n),
		f.kubeletEvent(s, supervisorPod, container, "Normal", "BackOff", fmt.Sprintf("Back-off pulling image %q", image), n),
		f.kubeletEvent(s, supervisorPod, container, "Warning", "Failed", "Error: ImagePullBackOff", n),
	}
}

// start plays a container that starts cleanly.
func (f *fixture) start(s sandbox, supervisorPod bool, container, image string) []*eventpipev1.Occurrence {
	return []*eventpipev1.Occurrence{
		f.kubeletEvent(s, supervisorPod, container, "Normal", "Pulled",
			fmt.Sprintf("Successfully pulled image %q in 2.915s (2.915s including waiting). Image size: 2155861 bytes.", image), 1),
		f.kubeletEvent(s, supervisorPod, container, "Normal", "Created", "Created container: "+container, 1),
		f.kubeletEvent(s, supervisorPod, container, "Normal", "Started", "Started container "+container, 1),
	}
}

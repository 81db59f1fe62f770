package enrich

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestAttribution(t *testing.T) {
	type want struct {
		rule, role, id, name, workspace, gateway string
		missing                                  bool
	}
	const uuid2 = "5B8E2C41-9D7A-4F3E-8A61-C2D4E6F80A19"
	tests := []struct {
		name  string
		world func() *maps
		ref   ObjectRef
		want  want
	}{
		// 1. Sandbox CR.
		{"CR annotation (managed)", seedWorld, ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Name: "img-missing"},
			want{eventpipev1.AttributionSandboxAnnotation, eventpipev1.RoleSandbox, seedID, "img-missing", "repro", "openshell", false}},
		{"CR label only, v1alpha1", func() *maps {
			m := seedWorld()
			cr := seedCR(true)
			cr.Annotations = nil
			cr.APIVersion = "agents.x-k8s.io/v1alpha1"
			m.addSandbox(cr)
			return m
		}, ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1alpha1", Name: "img-missing"},
			want{eventpipev1.AttributionSandboxLabel, eventpipev1.RoleSandbox, seedID, "img-missing", "repro", "openshell", false}},
		{"CR not cached yet", newMaps, ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Name: "img-missing"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", true}},
		{"Sandbox of another API group", seedWorld, ObjectRef{Kind: "Sandbox", APIVersion: "example.com/v1", Name: "img-missing"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", false}},
		// 2. Pods, newer generation.
		{"pod annotation openshell.ai", seedWorld, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionPodAnnotation, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"pod annotation openshell.io (older generation)", func() *maps {
			m := seedWorld()
			p := seedPod()
			p.Annotations = PairsOf(map[string]string{"openshell.io/sandbox-id": seedID})
			p.Labels = nil
			m.addPod(p)
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionPodAnnotation, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"pod sandbox-id label", func() *maps {
			m := seedWorld()
			p := seedPod()
			p.Annotations = nil
			p.Labels = PairsOf(map[string]string{"openshell.ai/sandbox-id": seedID})
			m.addPod(p)
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionPodLabel, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"boundary-pair label", func() *maps {
			m := seedWorld()
			p := seedPod()
			p.Annotations = nil
			m.addPod(p)
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionBoundaryPair, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"supervisor pod, cached", seedWorld, ObjectRef{Kind: "Pod", Name: seedSupPod},
			want{eventpipev1.AttributionPodAnnotation, eventpipev1.RoleSupervisor, seedID, "img-missing", "repro", "openshell", false}},
		{"supervisor pod by name only (not cached yet)", func() *maps {
			m := newMaps()
			m.addNS(managedNamespace())
			return m
		}, ObjectRef{Kind: "Pod", Name: seedSupPod},
			want{eventpipev1.AttributionSupervisorName, eventpipev1.RoleSupervisor, seedID, "", "repro", "openshell", true}},
		{"supervisor pod by name, no labels (uppercase uuid)", func() *maps {
			m := seedWorld()
			m.addPod(&Pod{Meta: Meta{Namespace: seedNS, Name: "os-supervisor-" + uuid2}})
			return m
		}, ObjectRef{Kind: "Pod", Name: "os-supervisor-" + uuid2},
			want{eventpipev1.AttributionSupervisorName, eventpipev1.RoleSupervisor, uuid2, "", "repro", "openshell", false}},
		{"secret sharing the supervisor prefix", seedWorld, ObjectRef{Kind: "Secret", Name: seedSupPod + "-1"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", false}},
		{"pod with supervisor prefix but no uuid", seedWorld, ObjectRef{Kind: "Pod", Name: "os-supervisor-abc"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", true}},
		{"owner chain, controller", func() *maps {
			m := seedWorld()
			p := seedPod()
			p.Annotations, p.Labels = nil, nil
			m.addPod(p)
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionOwnerChain, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"owner chain, not controller, custom pod name", func() *maps {
			m := seedWorld()
			cr := seedCR(true)
			cr.PodName = "custom-pod"
			m.addSandbox(cr)
			m.addPod(&Pod{Meta: Meta{Namespace: seedNS, Name: "custom-pod", Owners: crOwner(false)}})
			return m
		}, ObjectRef{Kind: "Pod", Name: "custom-pod"},
			want{eventpipev1.AttributionOwnerChain, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"owner CR not cached yet", func() *maps {
			m := newMaps()
			m.addNS(managedNamespace())
			p := seedPod()
			p.Annotations, p.Labels = nil, nil
			m.addPod(p)
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", true}},
		{"pod name == CR name", func() *maps {
			m := seedWorld()
			m.addPod(&Pod{Meta: Meta{Namespace: seedNS, Name: "img-missing"}})
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionPodName, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", false}},
		{"pod name == CR name, pod not cached yet", func() *maps {
			m := seedWorld()
			delete(m.pods, nsName{seedNS, "img-missing"})
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionPodName, eventpipev1.RoleWorkload, seedID, "img-missing", "repro", "openshell", true}},
		{"pod name == CR name but CR names another pod", func() *maps {
			m := seedWorld()
			cr := seedCR(true)
			cr.PodName = "other"
			m.addSandbox(cr)
			m.addPod(&Pod{Meta: Meta{Namespace: seedNS, Name: "img-missing"}})
			return m
		}, ObjectRef{Kind: "Pod", Name: "img-missing"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", false}},
		{"unrelated pod", func() *maps {
			m := seedWorld()
			m.addPod(&Pod{Meta: Meta{Namespace: "kube-system", Name: "coredns-1"}})
			return m
		}, ObjectRef{Kind: "Pod", Namespace: "kube-system", Name: "coredns-1"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", false}},
		// 3. PVCs.
		{"PVC owner", seedWorld, ObjectRef{Kind: "PersistentVolumeClaim", Name: "workspace-img-missing"},
			want{eventpipev1.AttributionPVCOwner, eventpipev1.RoleVolume, seedID, "img-missing", "repro", "openshell", false}},
		{"PVC name rule", func() *maps {
			m := seedWorld()
			m.addPVC(&PVC{Meta: Meta{Namespace: seedNS, Name: "workspace-img-missing"}})
			return m
		}, ObjectRef{Kind: "PersistentVolumeClaim", Name: "workspace-img-missing"},
			want{eventpipev1.AttributionPVCName, eventpipev1.RoleVolume, seedID, "img-missing", "repro", "openshell", false}},
		{"PVC not cached, name rule", func() *maps {
			m := seedWorld()
			delete(m.pvcs, nsName{seedNS, "workspace-img-missing"})
			return m
		}, ObjectRef{Kind: "PersistentVolumeClaim", Name: "workspace-img-missing"},
			want{eventpipev1.AttributionPVCName, eventpipev1.RoleVolume, seedID, "img-missing", "repro", "openshell", false}},
		{"PVC of a re-created sandbox whose CR is not cached yet", func() *maps {
			// The old CR of the name is still cached; the claim's owner is
			// the new one: no name rule, the event waits for its owner.
			m := seedWorld()
			m.addPVC(&PVC{Meta: Meta{Namespace: seedNS, Name: "workspace-img-missing", UID: "new-claim",
				Owners: []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "img-missing", UID: "new-cr", Controller: true}}}})
			return m
		}, ObjectRef{Kind: "PersistentVolumeClaim", Name: "workspace-img-missing", UID: "new-claim"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", true}},
		{"PVC of nothing", seedWorld, ObjectRef{Kind: "PersistentVolumeClaim", Name: "data-postgres-0"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", true}},
		// 4. Workspace modes.
		{"managed: workspace from the namespace label", func() *maps {
			m := seedWorld()
			m.addSandbox(seedCR(false))
			return m
		}, ObjectRef{Kind: "Sandbox", Name: "img-missing"},
			want{eventpipev1.AttributionSandboxAnnotation, eventpipev1.RoleSandbox, seedID, "img-missing", "repro", "openshell", false}},
		{"managed: namespace not cached yet", func() *maps {
			m := seedWorld()
			m.addSandbox(seedCR(false))
			delete(m.namespaces, seedNS)
			return m
		}, ObjectRef{Kind: "Sandbox", Name: "img-missing"},
			want{eventpipev1.AttributionSandboxAnnotation, eventpipev1.RoleSandbox, seedID, "img-missing", "", "", true}},
		{"operator: namespace name is the workspace", operatorWorld, ObjectRef{Kind: "Pod", Namespace: "team-a", Name: "box"},
			want{eventpipev1.AttributionOwnerChain, eventpipev1.RoleWorkload, "11111111-2222-4333-8444-555555555555", "box", "team-a", "", false}},
		{"shared: <ws>--<name> in the shared namespace", sharedWorld, ObjectRef{Kind: "Pod", Namespace: "openshell", Name: "ws1--box"},
			want{eventpipev1.AttributionPodAnnotation, eventpipev1.RoleWorkload, "99999999-8888-4777-8666-555555555555", "box", "ws1", "", false}},
		{"shared: supervisor pod", sharedWorld, ObjectRef{Kind: "Pod", Namespace: "openshell", Name: "os-supervisor-99999999-8888-4777-8666-555555555555"},
			want{eventpipev1.AttributionSupervisorName, eventpipev1.RoleSupervisor, "99999999-8888-4777-8666-555555555555", "box", "ws1", "", false}},
		{"shared: PVC name rule", sharedWorld, ObjectRef{Kind: "PersistentVolumeClaim", Namespace: "openshell", Name: "workspace-ws1--box"},
			want{eventpipev1.AttributionPVCName, eventpipev1.RoleVolume, "99999999-8888-4777-8666-555555555555", "box", "ws1", "", false}},
		// Others.
		{"node event", seedWorld, ObjectRef{Kind: "Node", Name: "osrepro-control-plane"},
			want{eventpipev1.AttributionNone, eventpipev1.RoleNone, "", "", "", "", false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, NewDefaultConfig(), tt.world().lookups())
			ref := tt.ref
			ns := ref.Namespace
			if ns == "" {
				ns = seedNS
			}
			ev := &Event{APIVersion: "v1", Namespace: ns, UID: "u", ResourceVersion: "1", Involved: ref, Reason: "Test", LastTimestamp: t0}
			r := e.Enrich(ev, t0)
			o := r.Occurrence
			got := want{o.Attribution, o.Role, o.GetSandbox().GetId(), o.GetSandbox().GetName(), o.GetSandbox().GetWorkspace(), o.GetSandbox().GetGatewayId(), r.Missing}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			if (o.Sandbox == nil) != (tt.want.rule == eventpipev1.AttributionNone) {
				t.Errorf("sandbox %v with rule %s", o.Sandbox, o.Attribution)
			}
		})
	}
}

// operatorWorld: namespace "team-a" is the workspace; the CR carries no
// workspace label; the pod is found through its owner.
func operatorWorld() *maps {
	m := newMaps()
	id := "11111111-2222-4333-8444-555555555555"
	m.addNS(&Namespace{Meta: Meta{Name: "team-a"}})
	m.addSandbox(&Sandbox{Meta: Meta{Namespace: "team-a", Name: "box", UID: "cr-box", Annotations: PairsOf(map[string]string{"openshell.ai/sandbox-id": id})}, PodName: "box"})
	m.addPod(&Pod{Meta: Meta{Namespace: "team-a", Name: "box", Owners: []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "box", UID: "cr-box", Controller: true}}}})
	return m
}

// sharedWorld: one namespace "openshell", CR named ws1--box, older-generation
// pod annotation.
func sharedWorld() *maps {
	m := newMaps()
	id := "99999999-8888-4777-8666-555555555555"
	m.addNS(&Namespace{Meta: Meta{Name: "openshell"}})
	cr := &Sandbox{Meta: Meta{Namespace: "openshell", Name: "ws1--box", UID: "cr-shared", Labels: PairsOf(map[string]string{"openshell.ai/sandbox-id": id})}, PodName: "ws1--box"}
	m.addSandbox(cr)
	m.addPod(&Pod{Meta: Meta{Namespace: "openshell", Name: "ws1--box", Annotations: PairsOf(map[string]string{"openshell.io/sandbox-id": id})}})
	m.addPod(&Pod{Meta: Meta{Namespace: "openshell", Name: "os-supervisor-" + id,
		Owners: []Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "ws1--box", UID: "cr-shared"}}}})
	return m
}

func TestContainerImageRole(t *testing.T) {
	tests := []struct {
		pod, fieldPath, reason, msg string
		container, image, imageRole string
	}{
		{"img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed, "workspace-init", seedImage, eventpipev1.ImageRoleWorkload},
		{"img-missing", "spec.containers{agent}", "Started", "Started container agent", "agent", seedImage, eventpipev1.ImageRoleWorkload},
		{"img-missing", "spec.initContainers{openshell-supervisor-install}", "Pulling", `Pulling image "` + seedSupImage + `"`, "openshell-supervisor-install", seedSupImage, eventpipev1.ImageRoleSupervisor},
		{"img-missing", "spec.initContainers{openshell-sandbox-bootstrap}", "Pulled", `Container image "` + seedBootImage + `" already present on machine`, "openshell-sandbox-bootstrap", seedBootImage, eventpipev1.ImageRoleBootstrap},
		{"img-missing", "spec.initContainers{openshell-network-init}", "Created", "Created container: openshell-network-init", "openshell-network-init", seedSupImage, eventpipev1.ImageRoleInit},
		{"img-missing", "spec.containers{openshell-supervisor-network}", "Started", "Started container openshell-supervisor-network", "openshell-supervisor-network", seedSupImage, eventpipev1.ImageRoleUnknown},
		{seedSupPod, "spec.containers{supervisor}", "Pulled", `Container image "` + seedSupImage + `" already present on machine`, "supervisor", seedSupImage, eventpipev1.ImageRoleSupervisor},
		// No fieldPath: the image in the message names the container.
		{seedSupPod, "", "Failed", `Failed to pull image "` + seedSupImage + `": not found`, "supervisor", seedSupImage, eventpipev1.ImageRoleSupervisor},
		// No container, no image.
		{"img-missing", "", "Scheduled", "Successfully assigned x to y", "", "", ""},
	}
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	for _, tt := range tests {
		o := e.Enrich(podEvent(tt.pod, tt.fieldPath, tt.reason, tt.msg), t0).Occurrence
		if o.Container != tt.container || o.Image != tt.image || o.ImageRole != tt.imageRole {
			t.Errorf("%s %s: container/image/role = %q %q %q, want %q %q %q", tt.fieldPath, tt.reason, o.Container, o.Image, o.ImageRole, tt.container, tt.image, tt.imageRole)
		}
	}
}

// The gateway completes pulling_image on any Pulled; eventpipe only on the
// workload container's.
func TestProgressPulledOfBootstrapBug(t *testing.T) {
	type prog struct{ complete, label, active, detail string }
	tests := []struct {
		pod, fieldPath, reason, msg string
		want                        *prog
	}{
		{"img-missing", "", "Scheduled", "Successfully assigned", &prog{eventpipev1.StepRequestingSandbox, "Sandbox allocated", eventpipev1.StepPullingImage, ""}},
		{"img-missing", "spec.initContainers{openshell-sandbox-bootstrap}", "Pulled", `Container image "` + seedBootImage + `" already present on machine`, nil},
		{"img-missing", "spec.initContainers{openshell-supervisor-install}", "Pulled", `Successfully pulled image "` + seedSupImage + `" in 1.2s`, nil},
		{"img-missing", "spec.initContainers{workspace-init}", "Pulled", `Successfully pulled image "` + seedImage + `" in 1.2s`, nil},
		{"img-missing", "spec.initContainers{workspace-init}", "Pulling", `Pulling image "` + seedImage + `"`, &prog{"", "", eventpipev1.StepPullingImage, seedImage}},
		{"img-missing", "spec.containers{agent}", "Pulled", `Container image "` + seedImage + `" already present on machine`, &prog{eventpipev1.StepPullingImage, "Image pulled", eventpipev1.StepStartingSandbox, ""}},
		{"img-missing", "spec.initContainers{openshell-sandbox-bootstrap}", "Started", "Started container openshell-sandbox-bootstrap", nil},
		{"img-missing", "spec.containers{agent}", "Started", "Started container agent", &prog{eventpipev1.StepStartingSandbox, "Sandbox started", "", ""}},
		{seedSupPod, "", "Scheduled", "Successfully assigned", nil},
		{seedSupPod, "spec.containers{supervisor}", "Pulled", `Container image "` + seedSupImage + `" already present on machine`, nil},
		{"img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed, nil},
	}
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	for _, tt := range tests {
		p := e.Enrich(podEvent(tt.pod, tt.fieldPath, tt.reason, tt.msg), t0).Occurrence.Progress
		var got *prog
		if p != nil {
			got = &prog{p.CompleteStep, p.CompleteLabel, p.ActiveStep, p.ActiveDetail}
		}
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("%s %s %s: progress %+v, want %+v", tt.pod, tt.fieldPath, tt.reason, got, tt.want)
		}
	}
}

func TestDispositionAndInheritance(t *testing.T) {
	cfg := NewDefaultConfig()
	e := mustNew(t, cfg, seedWorld().lookups())
	fp := "spec.initContainers{workspace-init}"
	failed := podEvent("img-missing", fp, "Failed", seedFailed)
	failed.Involved.UID = seedPodUID
	step := func(ev *Event, count int32, at time.Time) *eventpipev1.PullFailure {
		c := *ev
		c.Count, c.FirstTimestamp, c.LastTimestamp, c.ResourceVersion = count, at, at, at.Format(time.RFC3339Nano)
		return e.Enrich(&c, at).Occurrence.PullFailure
	}
	// The same Event counting up: attempts follow the count.
	for i, want := range []string{"retrying", "retrying", "persistent"} {
		pf := step(failed, int32(i+1), t0.Add(time.Duration(i)*20*time.Second))
		if pf.Disposition != want || pf.Attempts != uint32(i+1) || pf.Category != eventpipev1.CategoryNotFound || pf.Source != eventpipev1.PullSourceEvent {
			t.Fatalf("failure %d: %+v, want %s", i+1, pf, want)
		}
	}
	// A relist of the same occurrence does not count twice.
	if pf := step(failed, 3, t0.Add(40*time.Second)); pf.Attempts != 3 {
		t.Fatalf("replayed occurrence counted: attempts %d", pf.Attempts)
	}
	// A bare back-off inherits the cause; "Error: ImagePullBackOff" too.
	backoff := podEvent("img-missing", fp, "BackOff", `Back-off pulling image "`+seedImage+`"`)
	backoff.Involved.UID = seedPodUID
	pf := step(backoff, 5, t0.Add(time.Minute))
	if pf.Category != eventpipev1.CategoryNotFound || pf.Disposition != eventpipev1.DispositionPersistent || pf.Image != seedImage || pf.Detail == "" {
		t.Fatalf("back-off did not inherit: %+v", pf)
	}
	errBackoff := podEvent("img-missing", fp, "Failed", "Error: ImagePullBackOff")
	errBackoff.Involved.UID = seedPodUID
	if pf := step(errBackoff, 5, t0.Add(time.Minute)); pf.Category != eventpipev1.CategoryNotFound || pf.Image != seedImage {
		t.Fatalf("Error: ImagePullBackOff did not inherit: %+v", pf)
	}
	if pf.FirstSeen.AsTime() != t0 || !pf.LastSeen.AsTime().Equal(t0.Add(time.Minute)) {
		t.Fatalf("first/last seen %v %v", pf.FirstSeen.AsTime(), pf.LastSeen.AsTime())
	}
	// The image got pulled: history is over.
	pulled := podEvent("img-missing", fp, "Pulled", `Successfully pulled image "`+seedImage+`" in 1s`)
	pulled.Involved.UID = seedPodUID
	e.Enrich(pulled, t0.Add(2*time.Minute))
	other := *failed
	other.UID = "another-event"
	if pf := step(&other, 1, t0.Add(3*time.Minute)); pf.Attempts != 1 || pf.Disposition != eventpipev1.DispositionRetrying {
		t.Fatalf("after Pulled: %+v", pf)
	}
	// A gap longer than the window starts afresh.
	late := t0.Add(3*time.Minute + cfg.PersistentWindow + time.Second)
	if pf := step(&other, 2, late); pf.Attempts != 2 || !pf.FirstSeen.AsTime().Equal(late) || pf.Disposition != eventpipev1.DispositionRetrying {
		t.Fatalf("after a gap longer than the window: %+v", pf)
	}
}

// An aggregated Event (count 7 since firstTimestamp) dates the failure from
// its firstTimestamp.
func TestFirstSeenFromAggregatedEvent(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed)
	ev.Count, ev.FirstTimestamp, ev.LastTimestamp = 7, t0, t0.Add(15*time.Minute)
	pf := e.Enrich(ev, t0.Add(16*time.Minute)).Occurrence.PullFailure
	if !pf.FirstSeen.AsTime().Equal(t0) || !pf.LastSeen.AsTime().Equal(t0.Add(15*time.Minute)) || pf.Attempts != 7 || pf.Disposition != eventpipev1.DispositionPersistent {
		t.Fatalf("aggregated event: %v", pf)
	}
}

func TestDispositionRetryableCausesStayRetrying(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	for i, msg := range []string{
		`Failed to pull image "x:1": rpc error: code = Unknown desc = Error response from daemon: toomanyrequests: You have reached your pull rate limit.`,
		`Failed to pull image "x:1": rpc error: code = Unknown desc = context deadline exceeded`,
		`Failed to pull image "x:1": dial tcp 10.0.0.1:443: connect: connection refused`,
	} {
		// One container each: failures of one container add up.
		ev := podEvent("img-missing", "spec.containers{c"+string(rune('0'+i))+"}", "Failed", msg)
		ev.UID, ev.Count = "ev-"+msg[len(msg)-12:], 50
		pf := e.Enrich(ev, t0).Occurrence.PullFailure
		if pf.Disposition != eventpipev1.DispositionRetrying || pf.Attempts != 50 {
			t.Errorf("%q: %+v", msg, pf)
		}
	}
}

// TestDispositionPerCategory: every category has a decided disposition (a
// category added without one fails here), and a runtime_store failure that
// keeps coming back turns persistent through Enrich.
func TestDispositionPerCategory(t *testing.T) {
	persistent := map[string]bool{
		eventpipev1.CategoryNotFound: true, eventpipev1.CategoryUnauthorized: true,
		eventpipev1.CategoryNotFoundOrUnauthorized: true, eventpipev1.CategoryInvalidReference: true,
		eventpipev1.CategoryNeverPull: true, eventpipev1.CategoryPlatformMismatch: true,
		eventpipev1.CategoryPolicyRejected: true, eventpipev1.CategoryRuntimeStore: true,
		eventpipev1.CategoryUnsupportedFormat:   true,
		eventpipev1.CategoryRegistryUnreachable: false, eventpipev1.CategoryTLSError: false,
		eventpipev1.CategoryRateLimited: false, eventpipev1.CategoryKubeletThrottled: false,
		eventpipev1.CategoryNodeStorage: false, eventpipev1.CategoryTimeout: false,
		eventpipev1.CategoryUnknown: false, eventpipev1.CategoryUnrecognised: false,
	}
	for _, c := range allCategories {
		want, decided := persistent[c]
		if !decided {
			t.Errorf("category %s: no disposition decided in this test", c)
			continue
		}
		if got := persistentCategory(c); got != want {
			t.Errorf("persistentCategory(%s) = %v, want %v", c, got, want)
		}
	}
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := podEvent("img-missing", "spec.containers{c9}", "Failed",
		`Failed to pull image "mongo:4.4": rpc error: code = FailedPrecondition desc = failed to pull and unpack image "docker.io/library/mongo:4.4": failed commit on ref "layer-sha256:16ec": unexpected commit digest sha256:e3b0, expected sha256:16ec: failed precondition`)
	ev.Count = 50
	pf := e.Enrich(ev, t0).Occurrence.PullFailure
	if pf.Category != eventpipev1.CategoryRuntimeStore || pf.Disposition != eventpipev1.DispositionPersistent {
		t.Errorf("content-store failure 50 times: %+v, want runtime_store persistent", pf)
	}
}

// The pull-failure seed: the workload pod's waiting state and its events.
func TestSeedImageMissing(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	occs := e.DiagnosePod(seedPod(), t0)
	if len(occs) != 1 {
		t.Fatalf("DiagnosePod: %d occurrences, want 1 (workspace-init)", len(occs))
	}
	o := occs[0]
	if o.EventId != seedPodUID+"/5302/workspace-init" || o.ReportingComponent != "eventpipe-agent" ||
		o.Container != "workspace-init" || o.ImageRole != eventpipev1.ImageRoleWorkload || o.Image != seedImage ||
		o.Role != eventpipev1.RoleWorkload || o.GetSandbox().GetId() != seedID || o.GetSandbox().GetWorkspace() != "repro" ||
		o.InvolvedObject.FieldPath != "spec.initContainers{workspace-init}" || o.Reason != "ImagePullBackOff" {
		t.Fatalf("unexpected occurrence: %v", o)
	}
	pf := o.PullFailure
	if pf.Source != eventpipev1.PullSourcePodStatus || pf.Category != eventpipev1.CategoryNotFound || pf.Image != seedImage ||
		pf.Detail != seedImage+": not found" {
		t.Fatalf("pull failure: %v", pf)
	}
	// Re-seeing the same pod version is the same occurrence and not a new attempt.
	again := e.DiagnosePod(seedPod(), t0.Add(time.Second))
	if again[0].EventId != o.EventId || again[0].PullFailure.Attempts != pf.Attempts {
		t.Fatalf("re-seen pod: %s attempts %d", again[0].EventId, again[0].PullFailure.Attempts)
	}
	// New pod versions: each ErrImagePull is an attempt, a back-off between
	// attempts is not.
	p := seedPod()
	wantAttempts := []uint32{2, 2, 3, 3}
	for i, reason := range []string{"ErrImagePull", "ImagePullBackOff", "ErrImagePull", "ImagePullBackOff"} {
		p.ResourceVersion = fmt.Sprint(6000 + i)
		p.Containers[3].WaitingReason = reason
		got := e.DiagnosePod(p, t0.Add(time.Duration(i+2)*time.Minute))[0].PullFailure
		if got.Attempts != wantAttempts[i] || got.Category != eventpipev1.CategoryNotFound {
			t.Fatalf("pod version %s (%s): attempts %d category %s, want %d", p.ResourceVersion, reason, got.Attempts, got.Category, wantAttempts[i])
		}
	}
	if got := e.DiagnosePod(seedSupervisorPod(), t0); got != nil {
		t.Fatalf("running supervisor pod diagnosed: %v", got)
	}
}

// The supervisor seed: workload pod Running 1/1, supervisor pod in
// ImagePullBackOff on a bad tag.
func TestSeedSupervisorBadTag(t *testing.T) {
	m := seedWorld()
	bad := "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"
	sup := seedSupervisorPod()
	sup.Phase = "Pending"
	sup.Containers[0].Image = bad
	sup.Containers[0].WaitingReason = "ImagePullBackOff"
	sup.Containers[0].WaitingMessage = `Back-off pulling image "` + bad + `": ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "` + bad + `": failed to resolve reference "` + bad + `": ` + bad + `: not found`
	m.addPod(sup)
	wl := seedPod()
	wl.Phase = "Running"
	for i := range wl.Containers {
		wl.Containers[i].WaitingReason, wl.Containers[i].WaitingMessage = "", ""
	}
	m.addPod(wl)
	e := mustNew(t, NewDefaultConfig(), m.lookups())
	if occ := e.DiagnosePod(wl, t0); occ != nil {
		t.Fatalf("running workload pod diagnosed: %v", occ)
	}
	occs := e.DiagnosePod(sup, t0)
	if len(occs) != 1 {
		t.Fatalf("%d occurrences", len(occs))
	}
	o := occs[0]
	if o.Role != eventpipev1.RoleSupervisor || o.ImageRole != eventpipev1.ImageRoleSupervisor || o.Container != "supervisor" ||
		o.GetSandbox().GetId() != seedID || o.PullFailure.Image != bad || o.PullFailure.Category != eventpipev1.CategoryNotFound {
		t.Fatalf("supervisor occurrence: %v", o)
	}
	// The kubelet's events about the same pod agree and push it to persistent.
	for i := 1; i <= 3; i++ {
		ev := podEvent(seedSupPod, "spec.containers{supervisor}", "Failed", `Failed to pull image "`+bad+`": rpc error: code = NotFound desc = failed to pull and unpack image "`+bad+`": failed to resolve reference "`+bad+`": `+bad+`: not found`)
		ev.Involved.UID, ev.Count = "sup-pod-uid", int32(i)
		o = e.Enrich(ev, t0).Occurrence
	}
	if o.PullFailure.Disposition != eventpipev1.DispositionPersistent || o.Attribution != eventpipev1.AttributionPodAnnotation {
		t.Fatalf("supervisor events: %v", o)
	}
}

func TestOccurrenceTime(t *testing.T) {
	a, b, c, d, obs := t0, t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second), t0.Add(time.Hour)
	tests := []struct {
		ev   Event
		want time.Time
	}{
		{Event{SeriesLastObserved: d, LastTimestamp: c, EventTime: b, FirstTimestamp: a}, d},
		{Event{LastTimestamp: c, EventTime: b, FirstTimestamp: a}, c},
		{Event{EventTime: b, FirstTimestamp: a}, b},
		{Event{FirstTimestamp: a}, a},
		{Event{}, obs},
		{Event{LastTimestamp: time.Unix(0, 0)}, obs},
	}
	e := mustNew(t, NewDefaultConfig(), Lookups{})
	for i, tt := range tests {
		o := e.Enrich(&tt.ev, obs).Occurrence
		if got := o.OccurredAt.AsTime(); !got.Equal(tt.want) {
			t.Errorf("case %d: %v, want %v", i, got, tt.want)
		}
	}
	// Never zero, even without an observed time.
	if o := e.Enrich(&Event{}, time.Time{}).Occurrence; o.OccurredAt.AsTime().Unix() <= 0 || o.ObservedAt.AsTime().Unix() <= 0 {
		t.Fatalf("zero time: %v %v", o.OccurredAt, o.ObservedAt)
	}
}

func TestHostileInput(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.MaxMessageBytes = 64
	e := mustNew(t, cfg, seedWorld().lookups())
	long := strings.Repeat("é", 100) // 200 bytes, 2-byte runes
	bad := "bad \xff\xfe utf8 \xc3"
	ev := podEvent("img-missing", "spec.containers{agent\xff}", "Failed\xff", `Failed to pull image "`+seedImage+`": `+long)
	ev.Name, ev.UID = bad, strings.Repeat("u", 5000)
	o := e.Enrich(ev, t0).Occurrence
	if !o.MessageTruncated || len(o.Message) > 64 || !strings.HasSuffix(o.Message, TruncationMarker) || !utf8.ValidString(o.Message) {
		t.Fatalf("message not truncated safely: %d bytes %q", len(o.Message), o.Message)
	}
	if _, err := protojson.Marshal(o); err != nil {
		t.Fatalf("occurrence does not marshal: %v", err)
	}
	if !utf8.ValidString(o.Event.Name) || len(o.Event.Uid) > maxFieldBytes {
		t.Fatalf("fields not cleaned: %q (%d)", o.Event.Name, len(o.Event.Uid))
	}
	short := podEvent("img-missing", "", "Warning", bad)
	o = e.Enrich(short, t0).Occurrence
	if o.MessageTruncated || o.Message != "bad \uFFFD utf8 \uFFFD" {
		t.Fatalf("invalid UTF-8 not replaced: %q", o.Message)
	}
	// nil and empty inputs.
	_ = e.Enrich(nil, time.Time{})
	_ = e.DiagnosePod(nil, time.Time{})
	_ = e.DiagnosePod(&Pod{Containers: []Container{{Name: "x", WaitingReason: "ErrImagePull"}}}, time.Time{})
}

func TestTrackerBounded(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.TrackerCapacity = 3
	e := mustNew(t, cfg, Lookups{})
	for i := 0; i < 10; i++ {
		ev := podEvent("p"+strings.Repeat("x", i), "spec.containers{c}", "Failed", seedFailed)
		e.Enrich(ev, t0)
	}
	if n := e.tracker.len(); n != 3 {
		t.Fatalf("tracker holds %d entries, capacity 3", n)
	}
}

func TestConcurrentEnrich(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				ev := podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed)
				ev.Count = int32(i + 1)
				if o := e.Enrich(ev, t0).Occurrence; o.PullFailure == nil {
					t.Error("no pull failure")
					return
				}
				e.DiagnosePod(seedPod(), t0)
			}
		}()
	}
	wg.Wait()
}

func TestConfigValidate(t *testing.T) {
	if err := NewDefaultConfig().Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	c := NewDefaultConfig()
	c.MaxMessageBytes = 3
	c.PersistentAfter = 0
	c.PersistentWindow = -time.Second
	c.TrackerCapacity = 0
	c.Rules.SandboxIDKeys = []string{"", "x"}
	c.Rules.SandboxKind = ""
	c.Rules.ProgressContainer = ""
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, path := range []string{"max_message_bytes:", "persistent_after:", "persistent_window:", "tracker_capacity:", "rules.sandbox_id_keys[0]:", "rules.sandbox_kind:", "rules.progress_container:"} {
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error does not report %s: %v", path, err)
		}
	}
	if _, err := New(c, Lookups{}); err == nil {
		t.Fatal("New accepted an invalid config")
	}
}

// Every rule is configurable: a renamed supervisor prefix and label keys.
func TestRulesConfigurable(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Rules.SupervisorPodPrefix = "sup-"
	cfg.Rules.SandboxIDKeys = []string{"example.com/id"}
	m := newMaps()
	m.addPod(&Pod{Meta: Meta{Namespace: "n", Name: "w", Annotations: PairsOf(map[string]string{"example.com/id": "abc"})}})
	m.addNS(&Namespace{Meta: Meta{Name: "n"}})
	e := mustNew(t, cfg, m.lookups())
	o := e.Enrich(&Event{Namespace: "n", Involved: ObjectRef{Kind: "Pod", Name: "w"}}, t0).Occurrence
	if o.Attribution != eventpipev1.AttributionPodAnnotation || o.Sandbox.GetId() != "abc" || o.Sandbox.GetWorkspace() != "n" {
		t.Fatalf("custom key: %v", o)
	}
	o = e.Enrich(&Event{Namespace: "n", Involved: ObjectRef{Kind: "Pod", Name: "sup-" + seedID}}, t0).Occurrence
	if o.Attribution != eventpipev1.AttributionSupervisorName || o.Role != eventpipev1.RoleSupervisor {
		t.Fatalf("custom prefix: %v", o)
	}
}

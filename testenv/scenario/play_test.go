package scenario_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/crds"
	"github.com/eventpipe/eventpipe/testenv/scenario"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Every named scenario, in every workspace mode, plays into the real
// apiserver and reads back through both Event APIs with its fields intact.
func TestNamedScenariosReadBack(t *testing.T) {
	n := 0
	for _, name := range scenario.Names() {
		for _, mode := range scenario.Modes {
			gens := []scenario.Generation{scenario.Newer}
			if mode == scenario.ModeManaged && (name == "sup-bad" || name == "img-missing") {
				gens = append(gens, scenario.Older)
			}
			for _, gen := range gens {
				n++
				p := scenario.Params{Mode: mode, Generation: gen, Workspace: fmt.Sprintf("ws%02d", n)}
				if n%4 == 0 {
					p.CRAPIVersion = scenario.SandboxAPIVersionV1alpha1
				}
				t.Run(fmt.Sprintf("%s/%s/gen%d", name, mode, gen), func(t *testing.T) {
					ctx := ctxT(t)
					sc, err := scenario.Build(name, p)
					if err != nil {
						t.Fatal(err)
					}
					res, err := scenario.Play(ctx, clients, sc)
					if err != nil {
						t.Fatal(err)
					}
					if len(res.Events) != sc.EventCount() {
						t.Fatalf("played %d events, scenario has %d", len(res.Events), sc.EventCount())
					}
					for _, pe := range res.Events {
						checkReadBack(ctx, t, pe, infoOf(sc, pe.Key))
					}
					checkObjects(ctx, t, name, sc, res)
				})
			}
		}
	}
}

func infoOf(sc *scenario.Scenario, key string) scenario.EventInfo {
	for _, e := range sc.Events() {
		if e.Key == key {
			return e
		}
	}
	return scenario.EventInfo{}
}

func checkReadBack(ctx context.Context, t *testing.T, pe scenario.PlayedEvent, info scenario.EventInfo) {
	t.Helper()
	core, err := clients.Kube.CoreV1().Events(pe.Namespace).Get(ctx, pe.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("core/v1 get %s/%s: %v", pe.Namespace, pe.Name, err)
	}
	ev1, err := clients.Kube.EventsV1().Events(pe.Namespace).Get(ctx, pe.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("events.k8s.io/v1 get %s/%s: %v", pe.Namespace, pe.Name, err)
	}
	where := fmt.Sprintf("%s %s (%s)", pe.Name, pe.Reason, pe.API)
	if string(core.UID) != pe.UID || string(ev1.UID) != pe.UID || core.ResourceVersion != pe.ResourceVersion {
		t.Errorf("%s: uid/rv core %s/%s events %s, played %s/%s", where, core.UID, core.ResourceVersion, ev1.UID, pe.UID, pe.ResourceVersion)
	}
	if !strings.HasPrefix(pe.Name, core.InvolvedObject.Name+".") {
		t.Errorf("%s: name does not follow <object>.<hex nanos> for %s", where, core.InvolvedObject.Name)
	}
	// Same object, two views.
	if core.Reason != pe.Reason || ev1.Reason != pe.Reason || core.Message != pe.Message || ev1.Note != pe.Message {
		t.Errorf("%s: reason/message core %q %q events %q %q", where, core.Reason, core.Message, ev1.Reason, ev1.Note)
	}
	if core.Type != info.Type || ev1.Type != info.Type {
		t.Errorf("%s: type core %q events %q, want %q", where, core.Type, ev1.Type, info.Type)
	}
	if core.InvolvedObject.FieldPath != info.FieldPath() || ev1.Regarding.FieldPath != info.FieldPath() {
		t.Errorf("%s: fieldPath core %q events %q, want %q", where, core.InvolvedObject.FieldPath, ev1.Regarding.FieldPath, info.FieldPath())
	}
	if string(core.InvolvedObject.UID) != pe.InvolvedUID || ev1.Regarding.Name != core.InvolvedObject.Name {
		t.Errorf("%s: involved uid %q (played %q), regarding %q", where, core.InvolvedObject.UID, pe.InvolvedUID, ev1.Regarding.Name)
	}
	if core.ReportingController != info.Component || ev1.ReportingController != info.Component {
		t.Errorf("%s: reporting core %q events %q, want %q", where, core.ReportingController, ev1.ReportingController, info.Component)
	}
	switch pe.API {
	case scenario.CoreV1:
		wantHost := ""
		if info.Component == scenario.KubeletComponent {
			wantHost = info.Sandbox.Node
		}
		if core.Source.Component != info.Component || core.Source.Host != wantHost || core.ReportingInstance != wantHost {
			t.Errorf("%s: source %+v reportingInstance %q, want %s/%s", where, core.Source, core.ReportingInstance, info.Component, wantHost)
		}
		if core.Count != pe.Count || ev1.DeprecatedCount != pe.Count {
			t.Errorf("%s: count core %d events.deprecatedCount %d, played %d", where, core.Count, ev1.DeprecatedCount, pe.Count)
		}
		if core.FirstTimestamp.IsZero() || core.LastTimestamp.Before(&core.FirstTimestamp) ||
			(pe.Count > 1 && !core.FirstTimestamp.Before(&core.LastTimestamp)) {
			t.Errorf("%s: first %v last %v count %d", where, core.FirstTimestamp, core.LastTimestamp, core.Count)
		}
		if !core.EventTime.IsZero() {
			t.Errorf("%s: kubelet core/v1 event has eventTime %v", where, core.EventTime)
		}
		if ev1.DeprecatedSource.Component != info.Component {
			t.Errorf("%s: events.k8s.io deprecatedSource %+v", where, ev1.DeprecatedSource)
		}
	case scenario.EventsV1:
		if ev1.EventTime.IsZero() || ev1.Action == "" || ev1.ReportingInstance == "" {
			t.Errorf("%s: eventTime %v action %q instance %q", where, ev1.EventTime, ev1.Action, ev1.ReportingInstance)
		}
		if !core.LastTimestamp.IsZero() || core.Source.Component != "" {
			t.Errorf("%s: events.k8s.io event has lastTimestamp %v / source %+v in core view", where, core.LastTimestamp, core.Source)
		}
		if pe.Count > 1 {
			if ev1.Series == nil || ev1.Series.Count != pe.Count || core.Series == nil || core.Series.Count != pe.Count ||
				ev1.Series.LastObservedTime.Before(&ev1.EventTime) {
				t.Errorf("%s: series %+v (core %+v), played count %d", where, ev1.Series, core.Series, pe.Count)
			}
		} else if ev1.Series != nil {
			t.Errorf("%s: series %+v on a single occurrence", where, ev1.Series)
		}
	}
}

var sandboxGVR = map[string]schema.GroupVersionResource{
	scenario.SandboxAPIVersionV1beta1:  crds.SandboxV1beta1,
	scenario.SandboxAPIVersionV1alpha1: crds.SandboxV1alpha1,
}

func checkObjects(ctx context.Context, t *testing.T, name string, sc *scenario.Scenario, res *scenario.Result) {
	t.Helper()
	sb := sc.Sandboxes[0]
	ns := sb.Namespace()
	pods := clients.Kube.CoreV1().Pods(ns)
	// The CR reads back through both versions with its identity.
	for _, gvr := range sandboxGVR {
		cr, err := clients.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, sb.CRName(), metav1.GetOptions{})
		if name == "deletion" {
			if !apierrors.IsNotFound(err) {
				t.Errorf("deleted CR %s: %v", gvr.Version, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("get sandbox %s via %s: %v", sb.CRName(), gvr.Version, err)
		}
		if cr.GetLabels()["openshell.ai/sandbox-id"] != sb.ID || cr.GetAnnotations()["openshell.ai/sandbox-id"] != sb.ID {
			t.Errorf("CR %s via %s: identity %v %v", sb.CRName(), gvr.Version, cr.GetLabels(), cr.GetAnnotations())
		}
	}
	if name == "deletion" {
		for _, n := range []string{sb.PodName(), sb.SupervisorPodName()} {
			if _, err := pods.Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("deleted pod %s: %v", n, err)
			}
		}
		if _, err := clients.Kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, sb.PVCName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("deleted pvc: %v", err)
		}
		last := res.Events[len(res.Events)-1]
		if last.Reason != "Killing" || last.InvolvedUID == "" {
			t.Errorf("deletion: last event %s involved %q, want Killing about the deleted pod", last.Reason, last.InvolvedUID)
		}
		return
	}
	pod, err := pods.Get(ctx, sb.PodName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("workload pod: %v", err)
	}
	if pod.UID != typesUID(res.UIDs["Pod "+ns+"/"+sb.PodName()]) {
		t.Errorf("workload pod uid %s, result %s", pod.UID, res.UIDs["Pod "+ns+"/"+sb.PodName()])
	}
	ctrl := metav1.GetControllerOf(pod)
	if ctrl == nil || ctrl.Kind != "Sandbox" || ctrl.Name != sb.CRName() {
		t.Errorf("workload pod controller %+v", ctrl)
	}
	var sup *corev1.Pod
	if sb.HasSupervisorPod() {
		if sup, err = pods.Get(ctx, sb.SupervisorPodName(), metav1.GetOptions{}); err != nil {
			t.Fatalf("supervisor pod: %v", err)
		}
		if metav1.GetControllerOf(sup) != nil || len(sup.OwnerReferences) != 1 || sup.OwnerReferences[0].Name != sb.CRName() {
			t.Errorf("supervisor pod owners %+v", sup.OwnerReferences)
		}
	}
	ready := readyCondition(ctx, t, sb)
	switch name {
	case "img-missing":
		w := initWaiting(pod, scenario.ContainerWorkspaceInit)
		if pod.Status.Phase != corev1.PodPending || w == nil || w.Reason != "ImagePullBackOff" ||
			w.Message != `Back-off pulling image "docker.io/library/busybox:0.0.0-does-not-exist": ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found` {
			t.Errorf("img-missing pod: phase %s waiting %+v", pod.Status.Phase, w)
		}
		if ready["reason"] != "DependenciesNotReady" || ready["message"] != `Pod exists with phase: Pending; init container "workspace-init" is waiting: ImagePullBackOff` {
			t.Errorf("img-missing Ready: %v", ready)
		}
	case "sup-bad":
		if sb.HasSupervisorPod() {
			if pod.Status.Phase != corev1.PodRunning || sup.Status.Phase != corev1.PodPending ||
				len(sup.Status.ContainerStatuses) != 1 || sup.Status.ContainerStatuses[0].State.Waiting == nil ||
				sup.Status.ContainerStatuses[0].State.Waiting.Reason != "ImagePullBackOff" {
				t.Errorf("sup-bad: workload %s, supervisor %s %+v", pod.Status.Phase, sup.Status.Phase, sup.Status.ContainerStatuses)
			}
		} else if w := initWaiting(pod, scenario.ContainerSupervisorInstall); w == nil || w.Reason != "ImagePullBackOff" {
			t.Errorf("sup-bad older: waiting %+v", w)
		}
	case "healthy", "event-before-object":
		if pod.Status.Phase != corev1.PodRunning || ready["status"] != "True" {
			t.Errorf("%s: phase %s ready %v", name, pod.Status.Phase, ready)
		}
		if name == "event-before-object" && res.Events[0].InvolvedUID != "" {
			t.Errorf("first event already knows its pod's uid %q", res.Events[0].InvolvedUID)
		}
	case "unschedulable":
		if pod.Spec.NodeName != "" || len(pod.Status.Conditions) != 1 || pod.Status.Conditions[0].Reason != corev1.PodReasonUnschedulable {
			t.Errorf("unschedulable: node %q conditions %+v", pod.Spec.NodeName, pod.Status.Conditions)
		}
	case "pvc-unbound":
		pvc, err := clients.Kube.CoreV1().PersistentVolumeClaims(sb.Namespace()).Get(ctx, sb.PVCName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pvc-unbound: %v", err)
		}
		if pvc.Spec.StorageClassName != nil || pvc.Status.Phase == corev1.ClaimBound || pod.Spec.NodeName != "" ||
			len(pod.Status.Conditions) != 1 || pod.Status.Conditions[0].Reason != corev1.PodReasonUnschedulable {
			t.Errorf("pvc-unbound: class %v phase %s node %q conditions %+v", pvc.Spec.StorageClassName, pvc.Status.Phase, pod.Spec.NodeName, pod.Status.Conditions)
		}
	case "crash-loop":
		cs := pod.Status.ContainerStatuses
		if len(cs) != 1 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "CrashLoopBackOff" ||
			!strings.Contains(cs[0].State.Waiting.Message, string(pod.UID)) || cs[0].RestartCount != 3 {
			t.Errorf("crash-loop: %+v", cs)
		}
	default:
		if w := initWaiting(pod, scenario.ContainerWorkspaceInit); w == nil || w.Reason != "ImagePullBackOff" {
			t.Errorf("%s: workspace-init waiting %+v", name, w)
		}
	}
}

func initWaiting(pod *corev1.Pod, container string) *corev1.ContainerStateWaiting {
	for _, s := range pod.Status.InitContainerStatuses {
		if s.Name == container {
			return s.State.Waiting
		}
	}
	return nil
}

func readyCondition(ctx context.Context, t *testing.T, sb scenario.Sandbox) map[string]any {
	cr, err := clients.Dynamic.Resource(crds.SandboxV1beta1).Namespace(sb.Namespace()).Get(ctx, sb.CRName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CR: %v", err)
	}
	conds, _, _ := unstructured.NestedSlice(cr.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Ready" {
			return m
		}
	}
	t.Errorf("CR %s has no Ready condition", sb.CRName())
	return nil
}

// The load generator writes what it reports, at about the rate asked for.
func TestLoad(t *testing.T) {
	ctx := ctxT(t)
	r, err := scenario.Load(ctx, clients, scenario.LoadOptions{Sandboxes: 30, Workers: 8, Rate: 400, Workspace: "load-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load: %v", r)
	if r.Sandboxes != 30 || r.Events != 30*scenario.LoadEventsPerSandbox || r.Objects != 90 || r.Errors != 0 {
		t.Errorf("load result %+v", r)
	}
	if r.EventRate > 400*1.25 {
		t.Errorf("achieved %.0f events/s, limit 400", r.EventRate)
	}
	list, err := clients.Kube.CoreV1().Events("openshell-openshell-load-test").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != r.Events {
		t.Errorf("listed %d events, load reports %d", len(list.Items), r.Events)
	}
}

func BenchmarkLoadUnlimited(b *testing.B) {
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		r, err := scenario.Load(ctx, clients, scenario.LoadOptions{Sandboxes: 50, Workers: 16,
			Workspace: "bench", NamePrefix: fmt.Sprintf("b%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(r.EventRate, "events/s")
	}
}

package agent

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// TestCachesFollowTheAPI runs the caches against the real kube-apiserver
// with the agent's least-privilege token: a first listing, then changes
// seen through the watches (add, status update to a waiting pull, delete
// into a tombstone), for all four kinds.
func TestCachesFollowTheAPI(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "cache-test"
	const id = "3f0e2c1a-8b7d-4e5f-9a6b-1c2d3e4f5a6b"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"openshell.ai/sandbox-workspace": "team-a", "kubernetes.io/metadata.name": ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sbGVR := schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	sb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": "sb-1", "namespace": ns,
			"labels":      map[string]any{"openshell.ai/sandbox-id": id, "app": "x"},
			"annotations": map[string]any{"agents.x-k8s.io/pod-name": "sb-1-pod"}},
		"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "agent", "image": "busybox"}}}}},
	}}
	created, err := dyn.Resource(sbGVR).Namespace(ns).Create(ctx, sb, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctrl := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sb-1-pod", Namespace: ns, Labels: map[string]string{"openshell.ai/sandbox-id": id},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "sb-1", UID: created.GetUID(), Controller: &ctrl}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "docker.io/library/busybox:0.0.0-does-not-exist"}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "workspace-sb-1", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := newKubeClient(wrapCounting(cluster.AgentConfig(), m))
	if err != nil {
		t.Fatal(err)
	}
	cfg := NewDefaultConfig()
	c, err := newCaches(ctx, cfg, kc, testLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	wait, err := c.start(ctx)
	defer func() { cancel(); wait() }()
	if err != nil {
		t.Fatal(err)
	}
	if c.sandboxGV != "agents.x-k8s.io/v1beta1" {
		t.Errorf("sandbox version discovered: %q", c.sandboxGV)
	}
	l := c.lookups()
	p, ok := l.Pods.Pod(ns, "sb-1-pod")
	if !ok || p.Labels.Get("openshell.ai/sandbox-id") != id || len(p.Owners) != 1 || p.Owners[0].UID != string(created.GetUID()) ||
		len(p.Containers) != 1 || p.Containers[0].Image != "docker.io/library/busybox:0.0.0-does-not-exist" {
		t.Errorf("pod %+v %v", p, ok)
	}
	if n, ok := l.Namespaces.Namespace(ns); !ok || n.Labels.Get("openshell.ai/sandbox-workspace") != "team-a" || len(n.Labels) != 1 {
		t.Errorf("namespace %+v %v (only the kept prefixes)", n, ok)
	}
	if v, ok := l.PVCs.PVC(ns, "workspace-sb-1"); !ok || v.UID == "" {
		t.Errorf("pvc %+v %v", v, ok)
	}
	s, ok := l.Sandboxes.SandboxByUID(string(created.GetUID()))
	if !ok || s.Name != "sb-1" || s.PodName != "sb-1-pod" || s.APIVersion != "agents.x-k8s.io/v1beta1" || s.Labels.Get("openshell.ai/sandbox-id") != id {
		t.Errorf("sandbox %+v %v", s, ok)
	}

	// A waiting pull in the pod's status reaches the diagnosis queue.
	pod, err = cs.CoreV1().Pods(ns).Get(ctx, "sb-1-pod", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msg := `failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`
	pod.Status.Phase = corev1.PodPending
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: msg}}}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-c.diagnose:
		if k != (objKey{ns, "sb-1-pod"}) {
			t.Errorf("diagnose key %v", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting pod was not queued for diagnosis")
	}
	p, _ = l.Pods.Pod(ns, "sb-1-pod")
	if p.Containers[0].WaitingReason != "ErrImagePull" || p.Containers[0].WaitingMessage != msg || p.Phase != "Pending" {
		t.Errorf("pod status not followed: %+v", p.Containers)
	}

	// Deleted objects are remembered as tombstones.
	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "sb-1-pod", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(sbGVR).Namespace(ns).Delete(ctx, "sb-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "deletions seen", func() (bool, string) {
		_, podLive := c.pods.store.get(objKey{ns, "sb-1-pod"})
		_, sbLive := c.sandboxes.store.getByUID(string(created.GetUID()))
		return !podLive && !sbLive, ""
	})
	if p, ok := l.Pods.Pod(ns, "sb-1-pod"); !ok || p.DeletedAt.IsZero() || p.Labels.Get("openshell.ai/sandbox-id") != id {
		t.Errorf("pod tombstone %+v %v", p, ok)
	}
	if s, ok := l.Sandboxes.SandboxByUID(string(created.GetUID())); !ok || s.DeletedAt.IsZero() {
		t.Errorf("sandbox tombstone %+v %v", s, ok)
	}
	// One listing per kind (a watch-list: one request), no GETs.
	for _, res := range []string{"pods", "persistentvolumeclaims", "namespaces", "sandboxes"} {
		if n := counterValue(t, m.apiRequests.WithLabelValues("list", res)); n != 0 {
			t.Errorf("%s: %v LISTs with watch-list on", res, n)
		}
		if n := counterValue(t, m.apiRequests.WithLabelValues("get", res)); n != 0 {
			t.Errorf("%s: %v GETs", res, n)
		}
		if n := counterValue(t, m.apiRequests.WithLabelValues("watch", res)); n < 1 {
			t.Errorf("%s: no watch", res)
		}
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

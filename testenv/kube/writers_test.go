package kube_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/testenv/kube"
)

// TestWriters starts the control plane with every writer and a hollow node
// and checks that each one does its job on it: the words checked are the
// components' own, read back from the apiserver.
func TestWriters(t *testing.T) {
	c := kube.Start(t, kube.WithWriters(kube.AllWriters))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	pids := c.WriterPIDs()
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "agent-sandbox-controller"} {
		if pids[name] == 0 {
			t.Fatalf("%s not running (writers: %v)", name, pids)
		}
	}
	nctx, ncancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer ncancel()
	if _, err := c.AddNode(nctx, kube.NodeConfig{Name: "node-1", CPU: "4", Memory: "8Gi"}); err != nil {
		t.Fatal(err)
	}
	const ns = "writers"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager's service account controller.
	if err := c.WaitServiceAccount(ctx, ns); err != nil {
		t.Fatal(err)
	}

	t.Run("node-lifecycle-controller", func(t *testing.T) {
		// The apiserver gave the new Node the not-ready taint; the
		// controller lifts it once the kubelet reports Ready, or the
		// scheduler would place nothing there.
		poll(ctx, t, "node-1 without the not-ready taint", func() (bool, string) {
			n, err := cs.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, ta := range n.Spec.Taints {
				if ta.Key == corev1.TaintNodeNotReady {
					return false, fmt.Sprint(n.Spec.Taints)
				}
			}
			return true, ""
		})
	})

	t.Run("scheduler", func(t *testing.T) {
		fits := pod(ns, "fits", "100m")
		tooBig := pod(ns, "too-big", "64")
		for _, p := range []*corev1.Pod{fits, tooBig} {
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		e := waitEvent(ctx, t, cs, ns, "fits", "Scheduled")
		if want := "Successfully assigned writers/fits to node-1"; e.Message != want || e.ReportingController != "default-scheduler" {
			t.Errorf("Scheduled: %q by %q, want %q by default-scheduler", e.Message, e.ReportingController, want)
		}
		e = waitEvent(ctx, t, cs, ns, "too-big", "FailedScheduling")
		if !strings.HasPrefix(e.Message, "0/1 nodes are available: 1 Insufficient cpu.") || e.Type != corev1.EventTypeWarning {
			t.Errorf("FailedScheduling: %s %q", e.Type, e.Message)
		}
	})

	t.Run("persistentvolume-controller", func(t *testing.T) {
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "no-class", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e := waitEvent(ctx, t, cs, ns, "no-class", "FailedBinding")
		if want := "no persistent volumes available for this claim and no storage class is set"; e.Message != want {
			t.Errorf("FailedBinding: %q, want %q", e.Message, want)
		}
	})

	t.Run("agent-sandbox-controller", func(t *testing.T) {
		dc, err := dynamic.NewForConfig(c.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		gvr := sandboxGVR
		created, err := dc.Resource(gvr).Namespace(ns).Create(ctx, sandbox(ns, "box", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// It creates the pod, controller-owned by the Sandbox ...
		var p *corev1.Pod
		poll(ctx, t, "the Sandbox's pod", func() (bool, string) {
			p, err = cs.CoreV1().Pods(ns).Get(ctx, "box", metav1.GetOptions{})
			return err == nil, fmt.Sprint(err)
		})
		if ref := metav1.GetControllerOf(p); ref == nil || ref.Kind != "Sandbox" || ref.UID != created.GetUID() {
			t.Errorf("pod's controller = %+v, want the Sandbox %s", ref, created.GetUID())
		}
		// ... and writes the Sandbox's Ready condition from it: scheduled
		// on node-1 by the scheduler, run by node-1's kubelet, which
		// reports it Ready with an address.
		poll(ctx, t, "the Sandbox's Ready condition", func() (bool, string) {
			got, err := dc.Resource(gvr).Namespace(ns).Get(ctx, "box", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			r := condition(got, "Ready")
			return r["status"] == "True" && r["reason"] == "DependenciesReady" && strings.HasPrefix(fmt.Sprint(r["message"]), "Pod is Ready"), fmt.Sprint(r)
		})
	})

	t.Run("namespace-controller", func(t *testing.T) {
		// Deleting a namespace finishes only when the namespace
		// controller has emptied it: a claim (its protection finalizer
		// lifted by the pvc-protection controller), a pod, a Sandbox and
		// the pod its controller made. No pod here is bound to a node (a
		// bound pod waits for its kubelet to confirm the deletion: the
		// Sandbox's pod of the test above shows that path).
		const gone = "writers-gone"
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gone}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitServiceAccount(ctx, gone); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Pods(gone).Create(ctx, pod(gone, "pending", "64"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: gone},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims(gone).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		dc, err := dynamic.NewForConfig(c.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		sb := sandbox(gone, "box", map[string]any{"pool": "none"})
		if _, err := dc.Resource(sandboxGVR).Namespace(gone).Create(ctx, sb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(ctx, t, "the Sandbox's pod", func() (bool, string) {
			_, err := cs.CoreV1().Pods(gone).Get(ctx, "box", metav1.GetOptions{})
			return err == nil, fmt.Sprint(err)
		})
		if err := cs.CoreV1().Namespaces().Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(ctx, t, "namespace "+gone+" gone", func() (bool, string) {
			n, err := cs.CoreV1().Namespaces().Get(ctx, gone, metav1.GetOptions{})
			if err != nil {
				return apierrors.IsNotFound(err), err.Error()
			}
			return false, fmt.Sprintf("%+v", n.Status.Conditions)
		})
	})
}

var sandboxGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}

func sandbox(ns, name string, nodeSelector map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"containers": []any{map[string]any{"name": "agent", "image": "docker.io/library/busybox:1.37"}}}
	if nodeSelector != nil {
		spec["nodeSelector"] = nodeSelector
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"podTemplate": map[string]any{"spec": spec}},
	}}
}

func pod(ns, name, cpu string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "docker.io/library/busybox:1.37",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
		}}},
	}
}

func condition(obj *unstructured.Unstructured, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

// waitEvent waits for an Event with reason about the object named name in
// ns and returns it.
func waitEvent(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, reason string) corev1.Event {
	t.Helper()
	var found corev1.Event
	poll(ctx, t, reason+" of "+name, func() (bool, string) {
		l, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range l.Items {
			if e.Reason == reason {
				found = e
				return true, ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Sprintf("events so far: %v", seen)
	})
	return found
}

func poll(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (last: %s)", what, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

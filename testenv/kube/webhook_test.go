package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/eventpipe/eventpipe/testenv/kube"
)

// The API server calls the webhook of ours over HTTPS (its own
// certificate, trusted through the configuration's caBundle) and refuses
// the pods its selector matches in its own words; other pods go through.
func TestDenyWebhook(t *testing.T) {
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	const name = "deny-test.eventpipe.test"
	w, err := kube.StartDenyWebhook(kube.DenyWebhookConfig{Name: name, Message: "pods labelled deny-me are not allowed here",
		ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"eventpipe.test/deny-me": "yes"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.Register(ctx, cs); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Unregister(context.Background(), cs); err != nil {
			t.Error(err)
		}
	}()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "deny-webhook"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	// The API server reads a new configuration within a second or so.
	var denyErr error
	for {
		_, denyErr = cs.CoreV1().Pods(ns.Name).Create(ctx, pod("denied", map[string]string{"eventpipe.test/deny-me": "yes"}), metav1.CreateOptions{})
		if denyErr != nil || ctx.Err() != nil {
			break
		}
		_ = cs.CoreV1().Pods(ns.Name).Delete(ctx, "denied", metav1.DeleteOptions{})
		time.Sleep(200 * time.Millisecond)
	}
	want := `admission webhook "` + name + `" denied the request: pods labelled deny-me are not allowed here`
	if denyErr == nil || !strings.Contains(denyErr.Error(), want) {
		t.Fatalf("create a matching pod: %v, want %q", denyErr, want)
	}
	if w.Denied() < 1 {
		t.Errorf("denied %d", w.Denied())
	}
	if _, err := cs.CoreV1().Pods(ns.Name).Create(ctx, pod("allowed", nil), metav1.CreateOptions{}); err != nil {
		t.Errorf("create a pod the selector does not match: %v", err)
	}
	_ = cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
}

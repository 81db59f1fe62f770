package kube_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/testenv/kube"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The tests of this file share one hollow node (a kubelet start costs tens
// of seconds on a loaded machine); each test keeps to its own namespace,
// and the node's runtime rules are keyed by namespace.
const hollowNode = "hollow-1"

var (
	nodeOnce sync.Once
	node     *kube.Node
	nodeErr  error
)

func hollow(t *testing.T) (*kube.Node, kubernetes.Interface) {
	t.Helper()
	nodeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // includes a cold build
		defer cancel()
		node, nodeErr = cluster.AddNode(ctx, kube.NodeConfig{
			Name: hollowNode, CPU: "2", Memory: "4Gi", Pods: 20,
			Labels:            map[string]string{"eventpipe.dev/pool": "hollow"},
			Taints:            []corev1.Taint{{Key: "dedicated", Value: "eventpipe", Effect: corev1.TaintEffectNoSchedule}},
			ExtendedResources: map[string]string{"nvidia.com/gpu": "1"},
			Runtime: kube.RuntimeConfig{
				Images: []kube.ImageRule{
					{Image: "docker.io/library/busybox:0.0.0-does-not-exist", Pull: kube.PullNotFound},
				},
				Containers: []kube.ContainerRule{
					{Namespace: "crash", Container: "crash", ExitAfter: kube.Duration(time.Second), ExitCode: 1},
					{Namespace: "crash", Container: "oom", ExitAfter: kube.Duration(time.Second), OOMKilled: true},
					{Namespace: "crash", Container: "unready", Exec: []kube.ExecRule{{Command: []string{"cat", "/tmp/ready"},
						ExitCode: 1, Stderr: "cat: can't open '/tmp/ready': No such file or directory"}}},
					{Namespace: "crash", Container: "dead", Exec: []kube.ExecRule{{Command: []string{"cat", "/tmp/healthy"},
						ExitCode: 1, Stderr: "cat: can't open '/tmp/healthy': No such file or directory"}}},
				},
				// The test binary is the image's entrypoint (servePart); the
				// image alone matches (TestHollowNodePortForward's namespace
				// has a generated name).
				Processes: []kube.ProcessRule{{Image: processImage, Run: testBinary()}},
			},
		})
	})
	if nodeErr != nil {
		t.Fatalf("hollow node: %v", nodeErr)
	}
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return node, cs
}

func createPod(t *testing.T, cs kubernetes.Interface, ns string, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	// Bound by nodeName: no scheduler runs in this package.
	pod.Namespace, pod.Spec.NodeName = ns, hollowNode
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// eventsOf waits until want holds for the Events about pod, as the
// apiserver stores them, and returns them; on timeout it fails the test
// with what was there and the kubelet's log.
func eventsOf(t *testing.T, cs kubernetes.Interface, n *kube.Node, ns, pod string, want func([]corev1.Event) string) []corev1.Event {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for {
		list, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			t.Fatal(err)
		}
		missing := want(list.Items)
		if missing == "" {
			return list.Items
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, e := range list.Items {
				fmt.Fprintf(&b, "  %s %s x%d [%s/%s] %s\n", e.Type, e.Reason, e.Count, e.Source.Component, e.Source.Host, e.Message)
			}
			t.Fatalf("events of %s/%s: still missing %s; have:\n%skubelet log:\n%s", ns, pod, missing, b.String(), n.LogTail(6000))
		}
		time.Sleep(time.Second)
	}
}

// find returns the first Event with reason whose message satisfies match.
func find(events []corev1.Event, reason string, match func(string) bool) *corev1.Event {
	for i, e := range events {
		if e.Reason == reason && match(e.Message) {
			return &events[i]
		}
	}
	return nil
}

func equals(s string) func(string) bool { return func(m string) bool { return m == s } }
func hasPrefix(s string) func(string) bool {
	return func(m string) bool { return strings.HasPrefix(m, s) }
}

// TestHollowNodeShape: capacity, labels and taints reach the Node object
// the kubelet registers, so a scheduler sees them.
func TestHollowNodeShape(t *testing.T) {
	_, cs := hollow(t)
	n, err := cs.CoreV1().Nodes().Get(context.Background(), hollowNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[corev1.ResourceName]string{"cpu": "2", "memory": "4Gi", "pods": "20", "nvidia.com/gpu": "1"} {
		if got := n.Status.Capacity[name]; got.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("capacity %s = %s, want %s", name, got.String(), want)
		}
	}
	if n.Labels["eventpipe.dev/pool"] != "hollow" || n.Labels["kubernetes.io/hostname"] != hollowNode {
		t.Errorf("labels %v", n.Labels)
	}
	// The apiserver adds node.kubernetes.io/not-ready at registration (no
	// node lifecycle controller runs here to lift it); ours must be there.
	tainted := false
	for _, ta := range n.Spec.Taints {
		tainted = tainted || ta.Key == "dedicated" && ta.Value == "eventpipe" && ta.Effect == corev1.TaintEffectNoSchedule
	}
	if !tainted {
		t.Errorf("taints %v, want dedicated=eventpipe:NoSchedule", n.Spec.Taints)
	}
	if !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://2.") {
		t.Errorf("runtime version %q", n.Status.NodeInfo.ContainerRuntimeVersion)
	}
}

// TestHollowNodeImageMissing is the seed's workload: the kubelet's own
// Events for a tag that does not exist, with containerd 2.x's words as the
// kubelet's CRI client passes them on, and the kubelet's back-off and
// correlator at work (a repeated Event is one object whose count grows).
func TestHollowNodeImageMissing(t *testing.T) {
	n, cs := hollow(t)
	const img = "docker.io/library/busybox:0.0.0-does-not-exist"
	createPod(t, cs, "pull", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "workload"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: img}}}})
	failed := `Failed to pull image "` + img + `": rpc error: code = NotFound desc = failed to pull and unpack image "` + img +
		`": failed to resolve reference "` + img + `": ` + img + `: not found`
	events := eventsOf(t, cs, n, "pull", "workload", func(ev []corev1.Event) string {
		for _, w := range []struct{ reason, message string }{
			{"Pulling", `Pulling image "` + img + `"`},
			{"Failed", failed},
			{"Failed", "Error: ErrImagePull"},
			{"BackOff", `Back-off pulling image "` + img + `"`},
			{"Failed", "Error: ImagePullBackOff"},
		} {
			if find(ev, w.reason, equals(w.message)) == nil {
				return w.reason + ": " + w.message
			}
		}
		if e := find(ev, "Pulling", hasPrefix("Pulling")); e.Count < 2 {
			return "a second pull attempt (Pulling count 2)"
		}
		return ""
	})
	for _, e := range events {
		if e.Source.Component != "kubelet" || e.Source.Host != hollowNode || e.ReportingController != "kubelet" {
			t.Errorf("%s event from %+v / %q, want the kubelet on %s", e.Reason, e.Source, e.ReportingController, hollowNode)
		}
		if e.InvolvedObject.FieldPath != "spec.containers{agent}" {
			t.Errorf("%s event about %q, want spec.containers{agent}", e.Reason, e.InvolvedObject.FieldPath)
		}
	}
	pod, err := cs.CoreV1().Pods("pull").Get(context.Background(), "workload", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := pod.Status.ContainerStatuses; len(st) != 1 || st[0].State.Waiting == nil ||
		(st[0].State.Waiting.Reason != "ImagePullBackOff" && st[0].State.Waiting.Reason != "ErrImagePull") {
		t.Errorf("container status %+v, want waiting on the pull", st)
	}
}

// TestHollowNodeContainers: a crash loop, an OOM kill, a failing readiness
// probe and a failing liveness probe (the kubelet kills and restarts the
// container), each as the kubelet reports it (Events and the pod's
// container status).
func TestHollowNodeContainers(t *testing.T) {
	n, cs := hollow(t)
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
		PeriodSeconds: 1, FailureThreshold: 1}
	liveness := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}},
		PeriodSeconds: 1, FailureThreshold: 1}
	for _, name := range []string{"crash", "oom", "unready", "dead"} {
		c := corev1.Container{Name: name, Image: "busybox:1.36"}
		switch name {
		case "unready":
			c.ReadinessProbe = probe
		case "dead":
			c.LivenessProbe = liveness
		}
		createPod(t, cs, "crash", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}})
	}
	cases := []struct {
		pod, reason, prefix string
		lastReason          string
		lastCode            int32
	}{
		{"crash", "BackOff", "Back-off restarting failed container crash in pod crash_crash(", "Error", 1},
		{"oom", "BackOff", "Back-off restarting failed container oom in pod oom_crash(", "OOMKilled", 137},
		{"unready", "Unhealthy", "Readiness probe failed: cat: can't open '/tmp/ready'", "", 0},
		{"dead", "Killing", "Container dead failed liveness probe, will be restarted", "", 0},
		{"dead", "Unhealthy", "Liveness probe failed: cat: can't open '/tmp/healthy'", "Error", 137},
	}
	for _, tc := range cases {
		eventsOf(t, cs, n, "crash", tc.pod, func(ev []corev1.Event) string {
			if find(ev, tc.reason, hasPrefix(tc.prefix)) == nil {
				return tc.reason + " " + tc.prefix
			}
			return ""
		})
		if tc.lastReason == "" {
			continue
		}
		pod, err := cs.CoreV1().Pods("crash").Get(context.Background(), tc.pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := pod.Status.ContainerStatuses
		if len(st) != 1 || st[0].RestartCount < 1 || st[0].LastTerminationState.Terminated == nil ||
			st[0].LastTerminationState.Terminated.Reason != tc.lastReason || st[0].LastTerminationState.Terminated.ExitCode != tc.lastCode {
			t.Errorf("%s: container status %+v, want a restart after %s (exit %d)", tc.pod, st, tc.lastReason, tc.lastCode)
		}
	}
}

// TestHollowNodeMissingSecret: the kubelet's volume manager fails the
// mounts of a Secret and a ConfigMap that do not exist.
func TestHollowNodeMissingSecret(t *testing.T) {
	n, cs := hollow(t)
	createPod(t, cs, "secret", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "workload"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "agent", Image: "busybox:1.36",
			VolumeMounts: []corev1.VolumeMount{{Name: "creds", MountPath: "/creds"}, {Name: "settings", MountPath: "/settings"}}}},
		Volumes: []corev1.Volume{
			{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "gateway-tls"}}},
			{Name: "settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "gateway-settings"}}}},
		},
	}})
	eventsOf(t, cs, n, "secret", "workload", func(ev []corev1.Event) string {
		for _, msg := range []string{
			`MountVolume.SetUp failed for volume "creds" : secret "gateway-tls" not found`,
			`MountVolume.SetUp failed for volume "settings" : configmap "gateway-settings" not found`,
		} {
			if find(ev, "FailedMount", equals(msg)) == nil {
				return "FailedMount: " + msg
			}
		}
		return ""
	})
}

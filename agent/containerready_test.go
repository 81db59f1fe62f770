package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// TestReadyQueued: the pod handler queues a pod version in which a
// container with a readiness or startup probe became ready, and nothing
// for a repeated update of a ready pod, a container going unready or one
// without such a probe; a pod of the first listing waits for the
// processor's sweep; a full queue drops and counts, never blocking the
// reflector.
func TestReadyQueued(t *testing.T) {
	m, _ := newMetrics(nil)
	c := &caches{changed: make(chan struct{}, 1), diagnose: make(chan objKey, 8), ready: make(chan readyChange, 1), m: m, log: testLogger(t)}
	k := &kindCache{c: c, store: newObjStore(false), tomb: newTombstones(time.Minute, 10), pod: true,
		refl: &reflector{}} // not synced: the first listing
	pod := func(rv string, ready, probed bool) *cached {
		return &cached{pod: &enrich.Pod{Meta: enrich.Meta{Namespace: "ns", Name: "web", UID: "u", ResourceVersion: rv},
			Containers: []enrich.Container{{Name: "agent", Probed: probed, Ready: ready, Started: true}}}}
	}
	queued := func() *readyChange {
		select {
		case rc := <-c.ready:
			return &rc
		default:
			return nil
		}
	}
	k.added(pod("1", true, true))
	if rc := queued(); rc != nil {
		t.Errorf("a pod of the first listing queued: %+v (the sweep covers it)", rc)
	}
	k.refl.synced.Store(true)
	for _, tc := range []struct {
		name     string
		old, cur *cached
		want     bool
	}{
		{"not ready to ready", pod("2", false, true), pod("3", true, true), true},
		{"a repeated update of a ready pod", pod("3", true, true), pod("4", true, true), false},
		{"ready to not ready", pod("4", true, true), pod("5", false, true), false},
		{"no readiness or startup probe", pod("5", false, false), pod("6", true, false), false},
	} {
		k.updated(tc.old, tc.cur)
		rc := queued()
		if (rc != nil) != tc.want {
			t.Errorf("%s: queued %+v, want %v", tc.name, rc, tc.want)
		}
		if rc != nil && (rc.old != tc.old.pod || rc.cur != tc.cur.pod) {
			t.Errorf("%s: queued another pair of versions", tc.name)
		}
	}
	k.added(pod("7", true, true))
	if rc := queued(); rc == nil || rc.old != nil {
		t.Errorf("a pod created since the listing, first seen ready: queued %+v", rc)
	}
	k.updated(pod("7", false, true), pod("8", true, true))
	k.updated(pod("8", false, true), pod("9", true, true))
	if n := counterValue(t, m.readyDropped); n != 1 {
		t.Errorf("dropped %v, want 1", n)
	}
}

// TestContainerReadyReachesCollector: on the real kube-apiserver, a
// sandbox pod whose container (with a readiness probe) goes from not
// ready to ready reaches the real collector as one container readiness
// occurrence named by that pod version, attributed to the sandbox; a
// later update of the ready pod writes none, nor does another pod of the
// cluster becoming ready. An agent started afterwards (a new term) sweeps
// its first listing and writes one for the pod's current version: what
// the first one reported is unknown to it. The pods run on no node: the
// test writes their status as the kubelet would.
func TestContainerReadyReachesCollector(t *testing.T) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	const ns, id = "ready-test", "7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		if err := cs.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete pods: %v", err)
		}
	})
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("ready", col.addr()))
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) {
		return ra.a.Ready() == nil && ra.a.synced.Load(), fmt.Sprint(ra.a.Ready())
	})

	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}}, PeriodSeconds: 2}
	mkPod := func(name string, ann map[string]string) *corev1.Pod {
		p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "agent", Image: "ghcr.io/example/agent:1.0", ReadinessProbe: probe},
				{Name: "sidecar", Image: "ghcr.io/example/sidecar:1.0"},
			}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// setStatus writes the status the kubelet would: both containers
	// running, agent ready as given; note changes a condition's message
	// only (an update that changes no readiness).
	setStatus := func(p *corev1.Pod, agentReady bool, note string) *corev1.Pod {
		t.Helper()
		cur, err := cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		yes := true
		running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
		cur.Status = corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: "eventpipe.test/note", Status: corev1.ConditionTrue, Message: note}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "agent", Image: "ghcr.io/example/agent:1.0", Ready: agentReady, Started: &yes, State: running},
				{Name: "sidecar", Image: "ghcr.io/example/sidecar:1.0", Ready: true, Started: &yes, State: running},
			}}
		up, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return up
	}
	readies := func(pod string) []*eventpipev1.Occurrence {
		var out []*eventpipev1.Occurrence
		for _, o := range col.all(t) {
			if eventpipev1.IsContainerReady(o) && o.GetInvolvedObject().GetNamespace() == ns && o.GetInvolvedObject().GetName() == pod {
				out = append(out, o)
			}
		}
		return out
	}

	sbx := mkPod("sandbox-pod", map[string]string{"openshell.ai/sandbox-id": id})
	other := mkPod("other-pod", nil)
	setStatus(sbx, false, "starting")
	setStatus(other, false, "starting")
	became := setStatus(sbx, true, "probe passes")
	setStatus(other, true, "probe passes")
	last := setStatus(sbx, true, "still ready")

	var got []*eventpipev1.Occurrence
	waitFor(t, 60*time.Second, "the container readiness at the collector", func() (bool, string) {
		got = readies(sbx.Name)
		return len(got) > 0, fmt.Sprint(got)
	})
	time.Sleep(2 * time.Second) // anything else the agent ships arrives too
	if got = readies(sbx.Name); len(got) != 1 {
		t.Fatalf("%d container readiness occurrences of the sandbox pod, want 1 (the transition only): %v", len(got), got)
	}
	o := got[0]
	wantID := eventpipev1.ContainerReadyEventIDPrefix + string(sbx.UID) + "/" + became.ResourceVersion + "/agent"
	if o.GetEventId() != wantID || o.GetSandbox().GetId() != id || o.GetContainer() != "agent" ||
		o.GetInvolvedObject().GetFieldPath() != "spec.containers{agent}" || o.GetType() != "Normal" {
		t.Errorf("occurrence %v, want event_id %s for container agent of sandbox %s", o, wantID, id)
	}
	if n := len(readies(other.Name)); n != 0 {
		t.Errorf("%d container readiness occurrences of a pod of no sandbox", n)
	}

	// A new term: the first listing is swept once.
	ra.stop(t)
	ra2 := startAgent(t, testConfig("ready", col.addr()))
	waitFor(t, 60*time.Second, "the second agent's sweep at the collector", func() (bool, string) {
		got = readies(sbx.Name)
		return len(got) == 2, fmt.Sprint(got)
	})
	if want := eventpipev1.ContainerReadyEventIDPrefix + string(sbx.UID) + "/" + last.ResourceVersion + "/agent"; got[1].GetEventId() != want {
		t.Errorf("swept occurrence %s, want %s (the listed pod version)", got[1].GetEventId(), want)
	}
	if n := counter(t, ra2.reg, "eventpipe_agent_occurrences_total", map[string]string{"source": sourceContainerReady}); n < 1 {
		t.Errorf("occurrences{source=%s} = %v", sourceContainerReady, n)
	}
	if n := len(readies(other.Name)); n != 0 {
		t.Errorf("the sweep wrote %d for a pod of no sandbox", n)
	}
}

//go:build !agentonly

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// Exit codes come from the same termination as the reason, the current one
// first, as the agent's decoder takes them, and reach the crash blocker.
func TestDecodePodExitCodes(t *testing.T) {
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "openshell-openshell-repro", Name: "crash-loop", UID: "9a8b7c6d-0000-4000-8000-000000000000", ResourceVersion: "77"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "i"}, {Name: "neg", Image: "i"},
			{Name: "noreason", Image: "i"}, {Name: "fresh", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "agent", RestartCount: 4, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: "back-off 1m20s restarting failed container=agent pod=crash-loop_openshell-openshell-repro(9a8b7c6d-0000-4000-8000-000000000000)"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}},
			{Name: "neg", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: -1073741510, Reason: "Error"}}},
			{Name: "noreason", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}},
			{Name: "fresh", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		}},
	}
	s, p := decodedPod(t, pod)
	if len(p.Containers) != 4 {
		t.Fatalf("pod: %+v", p)
	}
	for i, want := range []struct {
		reason string
		code   int32
	}{{"OOMKilled", 137}, {"Error", -1073741510}, {"", 2}, {"", 0}} {
		if c := p.Containers[i]; c.TerminatedReason != want.reason || c.TerminatedExitCode != want.code {
			t.Errorf("%s: reason %q code %d, want %q %d", c.Name, c.TerminatedReason, c.TerminatedExitCode, want.reason, want.code)
		}
	}

	cfg := enrich.NewDefaultConfig()
	cfg.Cluster = "test"
	en, err := enrich.New(cfg, s.lookups())
	if err != nil {
		t.Fatal(err)
	}
	var b *eventpipev1.Blocker
	for _, o := range en.DiagnosePod(p, time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)) {
		if o.GetContainer() == "agent" {
			b = o.GetBlocker()
		}
	}
	if b == nil || b.GetCause() != eventpipev1.BlockerOOMKilled || !b.GetHasExitCode() || b.GetExitCode() != 137 {
		t.Errorf("crash blocker %v, want oom_killed with exit code 137", b)
	}
}

// Whether a readiness or startup probe is set, and ready and started, as
// the agent's decoder takes them: the enricher reads them to tell a probe
// failure that keeps a container unready from one that does not.
func TestDecodePodReadiness(t *testing.T) {
	yes, no := true, false
	exec := corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}}
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "openshell-openshell-repro", Name: "unready", UID: "9a8b7c6d-0000-4000-8000-000000000001", ResourceVersion: "78"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "agent", Image: "i", ReadinessProbe: &corev1.Probe{ProbeHandler: exec}},
			{Name: "slow", Image: "i", StartupProbe: &corev1.Probe{ProbeHandler: exec}},
			{Name: "live", Image: "i", LivenessProbe: &corev1.Probe{ProbeHandler: exec}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "agent", Ready: true, Started: &yes},
			{Name: "slow", Started: &no},
			{Name: "live", Ready: true},
		}},
	}
	_, p := decodedPod(t, pod)
	if len(p.Containers) != 3 {
		t.Fatalf("pod: %+v", p)
	}
	for i, want := range []struct{ probed, ready, started bool }{{true, true, true}, {true, false, false}, {false, true, false}} {
		if c := p.Containers[i]; c.Probed != want.probed || c.Ready != want.ready || c.Started != want.started {
			t.Errorf("%s: probed %v ready %v started %v, want %+v", c.Name, c.Probed, c.Ready, c.Started, want)
		}
	}
}

// decodedPod is pod as `eventpipe enrich` reads it from kubectl's JSON.
func decodedPod(t *testing.T, pod corev1.Pod) (*snapshot, *enrich.Pod) {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeInput(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	p := s.pods[pod.Namespace+"/"+pod.Name]
	if p == nil {
		t.Fatalf("pod %s/%s not decoded", pod.Namespace, pod.Name)
	}
	return s, p
}

package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// TestProbeAndTerminatedBlockersReachCollector plays, into the real
// kube-apiserver while one agent runs, the blockers issue 24 added: a
// readiness probe that fails three times (the kubelet's default
// failureThreshold) on one sandbox's agent container, then that container
// terminated OOMKilled with nothing waiting (restartPolicy Never); and a
// second sandbox whose init container ended in Error (kubectl's
// Init:Error). At the real collector: the first two probe failures carry
// no blocker (transient), the third a readiness_probe_failed blocker with
// the kubelet's words; the pod statuses arrive as pod_status blockers
// oom_killed (exit 137) and exit_error (exit 2) with their fixes.
func TestProbeAndTerminatedBlockersReachCollector(t *testing.T) {
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("lasting", col.addr()))
	clients, err := scenario.NewClients(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) {
		return ra.a.Ready() == nil && ra.a.synced.Load(), fmt.Sprint(ra.a.Ready())
	})

	probe := scenario.NewSandbox("probe-oom", "blk-probe-oom", scenario.ModeManaged)
	initErr := scenario.NewSandbox("init-error", "blk-init-error", scenario.ModeManaged)
	b := scenario.NewBuilder("probe-and-terminated", "a readiness probe that keeps failing, then OOMKilled; an init container in Error")
	for _, sb := range []scenario.Sandbox{probe, initErr} {
		b.Namespace(sb).SandboxCR(sb)
		b.After(150 * time.Millisecond).PVC(sb)
		b.WorkloadPod(sb)
	}
	b.After(300 * time.Millisecond)
	const words = "Readiness probe failed: HTTP probe failed with statuscode: 503"
	unhealthy := b.Kubelet(probe, scenario.TargetWorkloadPod, scenario.ContainerAgent, corev1.EventTypeWarning, "Unhealthy", words)
	b.After(500 * time.Millisecond).Repeat(unhealthy)
	b.After(500 * time.Millisecond).Repeat(unhealthy)
	b.After(300*time.Millisecond).PodStatus(probe, scenario.TargetWorkloadPod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodFailed
		s.ContainerStatuses = []corev1.ContainerStatus{{Name: scenario.ContainerAgent, Image: probe.Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}}}
	})
	b.PodStatus(initErr, scenario.TargetWorkloadPod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodFailed
		s.InitContainerStatuses = nil
		for _, c := range initErr.InitContainers() {
			st := corev1.ContainerStatus{Name: c.Name, Image: c.Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}
			if c.Name == scenario.ContainerWorkspaceInit {
				st.State.Terminated = &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 2}
			}
			s.InitContainerStatuses = append(s.InitContainerStatuses, st)
		}
	})
	s, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	res, err := scenario.Play(context.Background(), clients, s)
	if err != nil {
		t.Fatalf("play: %v", err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		for _, sb := range []scenario.Sandbox{probe, initErr} {
			if err := clients.Kube.CoreV1().Pods(sb.Namespace()).DeleteCollection(context.Background(),
				metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
				t.Errorf("delete pods in %s: %v", sb.Namespace(), err)
			}
		}
	})
	played, ok := res.Event(unhealthy)
	if !ok {
		t.Fatal("the Unhealthy event was not played")
	}

	var byCount map[int32]*eventpipev1.Occurrence
	var oom, exitErr *eventpipev1.Occurrence
	waitFor(t, 90*time.Second, "the three probe failures and both pod_status blockers at the collector", func() (bool, string) {
		byCount, oom, exitErr = map[int32]*eventpipev1.Occurrence{}, nil, nil
		for _, o := range col.all(t) {
			bl := o.GetBlocker()
			switch {
			case o.GetEvent().GetUid() == played.UID && o.GetReason() == "Unhealthy":
				byCount[o.GetCount()] = o
			case bl.GetSource() == eventpipev1.PullSourcePodStatus && o.GetSandbox().GetId() == probe.ID && bl.GetCause() == eventpipev1.BlockerOOMKilled:
				oom = o
			case bl.GetSource() == eventpipev1.PullSourcePodStatus && o.GetSandbox().GetId() == initErr.ID && bl.GetCause() == eventpipev1.BlockerExitError:
				exitErr = o
			}
		}
		return len(byCount) == 3 && oom != nil && exitErr != nil,
			fmt.Sprintf("%d probe occurrences, oom %v, init error %v", len(byCount), oom != nil, exitErr != nil)
	})
	for n := int32(1); n <= 2; n++ {
		if b := byCount[n].GetBlocker(); b != nil {
			t.Errorf("probe failure %d of 3 is transient, got blocker %+v", n, b)
		}
	}
	if o, b := byCount[3], byCount[3].GetBlocker(); b.GetKind() != eventpipev1.BlockerKindContainer || b.GetCause() != eventpipev1.BlockerReadinessProbe ||
		b.GetContainer() != scenario.ContainerAgent || b.GetDetail() != words || b.GetAttempts() != 3 || b.GetFix() == "" ||
		b.GetDecidedBy() != eventpipev1.DecidedByTextRule || o.GetSandbox().GetId() != probe.ID {
		t.Errorf("third probe failure: sandbox %q blocker %+v", o.GetSandbox().GetId(), b)
	}
	if b := oom.GetBlocker(); b.GetContainer() != scenario.ContainerAgent || !b.GetHasExitCode() || b.GetExitCode() != 137 || b.GetFix() == "" {
		t.Errorf("OOMKilled: %+v", b)
	}
	if b := exitErr.GetBlocker(); b.GetContainer() != scenario.ContainerWorkspaceInit || b.GetExitCode() != 2 || b.GetDetail() != "Error (exit code 2)" || b.GetFix() == "" {
		t.Errorf("Init:Error: %+v", b)
	}
}

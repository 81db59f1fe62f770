package scenario

import (
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Blockers other than image pulls: the expectation option and the named
// scenarios that only they need (unschedulable and crash-loop are in
// named.go).

func init() {
	Named["pvc-unbound"] = UnboundPVC
}

// Blocks marks the event as reporting a blocker of the given kind and
// cause (eventpipev1.Blocker*); inMessage says whether its message alone
// names the cause.
func Blocks(kind, cause string, inMessage bool) EventOpt {
	return func(e *eventSpec) {
		e.expect.BlockerKind, e.expect.BlockerCause, e.expect.CauseInMessage = kind, cause, inMessage
	}
}

// Messages as kube-controller-manager's persistentvolume-controller and
// default-scheduler write them for a claim that names no StorageClass in a
// cluster without a default one.
const (
	msgNoStorageClass = "no persistent volumes available for this claim and no storage class is set"
	msgUnboundPVC     = "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)

// UnboundPVC: the workspace claim names no StorageClass and the cluster has
// no default one, so nothing provisions it: the persistentvolume-controller
// reports FailedBinding every resync (15 s) and the scheduler cannot place
// the workload pod (unbound immediate claim). The supervisor pod, which
// mounts no claim, runs.
func UnboundPVC(p Params) (*Scenario, error) {
	sb := p.sandbox("pvc-unbound")
	unbound := sb
	unbound.Node = ""
	b := NewBuilder("pvc-unbound", "the workspace PVC stays Pending: no StorageClass named and no default class in the cluster")
	b.Namespace(sb).SandboxCR(sb)
	b.After(150 * time.Millisecond).PVC(sb)
	fb := b.PVController(sb, corev1.EventTypeNormal, "FailedBinding", msgNoStorageClass,
		Blocks(eventpipev1.BlockerKindVolume, eventpipev1.BlockerNoStorageClass, true))
	b.WorkloadPod(unbound)
	b.Controller(sb, TargetSandbox, corev1.EventTypeNormal, "PodCreated", "Create", "Created Pod "+sb.PodName())
	if sb.HasSupervisorPod() {
		b.SupervisorPod(sb)
		b.After(100*time.Millisecond).Scheduler(sb, TargetSupervisorPod, corev1.EventTypeNormal, "Scheduled", "Binding",
			msgScheduled(sb.Namespace(), sb.SupervisorPodName(), sb.Node))
		runSupervisorPod(b, sb)
	}
	b.After(100 * time.Millisecond)
	fs := b.Scheduler(unbound, TargetWorkloadPod, corev1.EventTypeWarning, "FailedScheduling", "Scheduling", msgUnboundPVC,
		Blocks(eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerUnboundPVC, true))
	b.PodStatus(unbound, TargetWorkloadPod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodPending
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: msgUnboundPVC, LastTransitionTime: metav1.Now()}}
	})
	b.SandboxConditions(sb, Condition{"Ready", "False", ReadyReasonNotReady, "Pod exists with phase: Pending"})
	for range 4 {
		b.After(15 * time.Second).Repeat(fb).Repeat(fs)
	}
	return b.Build()
}

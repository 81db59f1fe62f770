package scenario

import (
	"fmt"
	"sort"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Images the named scenarios pull.
const (
	ImageMissing        = "docker.io/library/busybox:0.0.0-does-not-exist"
	SupervisorImageBad  = "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"
	ImagePrivate        = "registry.example.com/team/private-agent:1.4"
	ImageUnreachable    = "registry.internal.example:5000/team/agent:1.4"
	ImageRateLimited    = "docker.io/library/python:3.12-slim"
	ImageCrashingAgent  = "ghcr.io/example/crashing-agent:2.0"
	DefaultWorkspace    = "repro"
	ReadyReasonNotReady = "DependenciesNotReady"
)

// Params choose where a named scenario plays.
type Params struct {
	Mode       Mode       // default managed
	Workspace  string     // default "repro"
	Name       string     // sandbox name; default the scenario's own (e.g. img-missing)
	Generation Generation // default Newer
	Gateway    string     // default "openshell"
	// CRAPIVersion creates the CR through this version (default v1beta1).
	CRAPIVersion string
}

func (p Params) sandbox(defaultName string) Sandbox {
	if p.Mode == "" {
		p.Mode = ModeManaged
	}
	if p.Workspace == "" {
		p.Workspace = DefaultWorkspace
	}
	if p.Name == "" {
		p.Name = defaultName
	}
	sb := NewSandbox(p.Name, p.Workspace, p.Mode)
	sb.Generation = p.Generation
	if p.Gateway != "" {
		sb.Gateway = p.Gateway
	}
	if p.CRAPIVersion != "" {
		sb.CRAPIVersion = p.CRAPIVersion
	}
	return sb
}

// Named maps a scenario name to its constructor.
var Named = map[string]func(Params) (*Scenario, error){
	"healthy":               Healthy,
	"img-missing":           ImageNotFound,
	"sup-bad":               SupervisorBadTag,
	"registry-unauthorized": RegistryUnauthorized,
	"registry-unreachable":  RegistryUnreachable,
	"rate-limited":          RateLimited,
	"unschedulable":         Unschedulable,
	"crash-loop":            CrashLoop,
	"deletion":              Deletion,
	"event-before-object":   EventBeforeObject,
}

// Names lists the named scenarios, sorted.
func Names() []string {
	out := make([]string, 0, len(Named))
	for n := range Named {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Build builds a named scenario.
func Build(name string, p Params) (*Scenario, error) {
	f, ok := Named[name]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q (known: %v)", name, Names())
	}
	return f(p)
}

// createObjects: namespace, CR, PVC, pods, and the scheduler's Scheduled
// events. OpenShell creates the CR; the Agent Sandbox controller the PVC
// and pods.
func createObjects(b *Builder, sb Sandbox) {
	b.Namespace(sb).SandboxCR(sb)
	b.After(150 * time.Millisecond).PVC(sb)
	b.PVController(sb, corev1.EventTypeNormal, "WaitForFirstConsumer", "waiting for first consumer to be created before binding")
	b.WorkloadPod(sb)
	b.Controller(sb, TargetSandbox, corev1.EventTypeNormal, "PodCreated", "Create", "Created Pod "+sb.PodName())
	if sb.HasSupervisorPod() {
		b.SupervisorPod(sb)
	}
	b.SandboxConditions(sb, Condition{"Ready", "False", ReadyReasonNotReady, "Pod exists with phase: Pending"})
	schedule(b, sb)
}

func schedule(b *Builder, sb Sandbox) {
	b.After(100*time.Millisecond).Scheduler(sb, TargetWorkloadPod, corev1.EventTypeNormal, "Scheduled", "Binding",
		msgScheduled(sb.Namespace(), sb.PodName(), sb.Node))
	if sb.HasSupervisorPod() {
		b.Scheduler(sb, TargetSupervisorPod, corev1.EventTypeNormal, "Scheduled", "Binding",
			msgScheduled(sb.Namespace(), sb.SupervisorPodName(), sb.Node))
	}
}

// runContainer: Pulled (present, or Pulling + Pulled when pull is set),
// Created, Started.
func runContainer(b *Builder, sb Sandbox, target Target, container, image string, pull bool) {
	b.After(400 * time.Millisecond)
	if pull {
		b.Kubelet(sb, target, container, corev1.EventTypeNormal, "Pulling", msgPulling(image), NamesImage(image))
		b.After(2915 * time.Millisecond)
		b.Kubelet(sb, target, container, corev1.EventTypeNormal, "Pulled", msgPulled(image), NamesImage(image))
	} else {
		b.Kubelet(sb, target, container, corev1.EventTypeNormal, "Pulled", msgPresent(image), NamesImage(image))
	}
	b.After(50*time.Millisecond).Kubelet(sb, target, container, corev1.EventTypeNormal, "Created", msgCreated(container))
	b.After(150*time.Millisecond).Kubelet(sb, target, container, corev1.EventTypeNormal, "Started", msgStarted(container))
}

// runInits runs the workload pod's init containers up to (not including)
// stop; workspace-init pulls the workload image, the others are present.
func runInits(b *Builder, sb Sandbox, stop string) {
	for _, c := range sb.InitContainers() {
		if c.Name == stop {
			return
		}
		runContainer(b, sb, TargetWorkloadPod, c.Name, c.Image, c.Name == ContainerWorkspaceInit)
	}
}

func runSupervisorPod(b *Builder, sb Sandbox) {
	if !sb.HasSupervisorPod() {
		return
	}
	runContainer(b, sb, TargetSupervisorPod, ContainerSupervisor, sb.SupervisorImage, true)
	b.podState(sb, TargetSupervisorPod, corev1.PodRunning, nil)
}

// runWorkload runs the whole workload pod and reports it Running.
func runWorkload(b *Builder, sb Sandbox) {
	runInits(b, sb, "")
	runContainer(b, sb, TargetWorkloadPod, ContainerAgent, sb.Image, false)
	b.podState(sb, TargetWorkloadPod, corev1.PodRunning, nil)
}

func ready(b *Builder, sb Sandbox) {
	b.SandboxConditions(sb, Condition{"Ready", "True", "DependenciesReady", "Pod is Ready; Service Exists"})
}

// pullFailure plays the kubelet's image-pull failure sequence for one
// container: Pulling, Failed (the runtime's error), Failed ErrImagePull,
// BackOff, Failed ImagePullBackOff, the waiting state in the pod status,
// then `retries` rounds of back-off (10 s, doubling) repeating them.
func pullFailure(b *Builder, sb Sandbox, target Target, container, image, runtimeErr, category string, retries int) {
	b.After(400 * time.Millisecond)
	pulling := b.Kubelet(sb, target, container, corev1.EventTypeNormal, "Pulling", msgPulling(image), NamesImage(image))
	b.After(700 * time.Millisecond)
	failed := b.Kubelet(sb, target, container, corev1.EventTypeWarning, "Failed", msgFailedPull(image, runtimeErr),
		NamesImage(image), PullFailed(category, true))
	errPull := b.Kubelet(sb, target, container, corev1.EventTypeWarning, "Failed", "Error: ErrImagePull",
		PullFailed(category, false))
	b.podState(sb, target, corev1.PodPending, map[string]cstate{
		container: {waitingReason: "ErrImagePull", waitingMessage: runtimeErr}})
	b.After(time.Second)
	backoff := b.Kubelet(sb, target, container, corev1.EventTypeNormal, "BackOff", msgBackOffPull(image),
		NamesImage(image), PullFailed(category, false))
	errBackoff := b.Kubelet(sb, target, container, corev1.EventTypeWarning, "Failed", "Error: ImagePullBackOff",
		PullFailed(category, false))
	backoffStatus := map[string]cstate{container: {waitingReason: "ImagePullBackOff",
		waitingMessage: fmt.Sprintf("Back-off pulling image %q: ErrImagePull: %s", image, runtimeErr)}}
	b.podState(sb, target, corev1.PodPending, backoffStatus)
	interval := 10 * time.Second
	for range retries {
		b.After(interval).Repeat(pulling).After(700 * time.Millisecond).Repeat(failed).Repeat(errPull)
		b.After(time.Second).Repeat(backoff).Repeat(errBackoff)
		interval *= 2
	}
}

func pendingOn(container string, reason string) string {
	return fmt.Sprintf("Pod exists with phase: Pending; init container %q is waiting: %s", container, reason)
}

// Healthy: a sandbox starts cleanly.
func Healthy(p Params) (*Scenario, error) {
	sb := p.sandbox("healthy")
	b := NewBuilder("healthy", "a sandbox starts cleanly: scheduled, images pulled, containers started, Ready")
	createObjects(b, sb)
	runSupervisorPod(b, sb)
	runWorkload(b, sb)
	ready(b, sb)
	return b.Build()
}

// workloadPullFailure: the workload image cannot be pulled (workspace-init
// is the first container to pull it).
func workloadPullFailure(name, desc string, p Params, image string, errf func(string) string, category string) (*Scenario, error) {
	sb := p.sandbox(name)
	sb.Image = image
	b := NewBuilder(name, desc)
	createObjects(b, sb)
	runSupervisorPod(b, sb)
	runInits(b, sb, ContainerWorkspaceInit)
	pullFailure(b, sb, TargetWorkloadPod, ContainerWorkspaceInit, image, errf(image), category, 3)
	b.SandboxConditions(sb, Condition{"Ready", "False", ReadyReasonNotReady, pendingOn(ContainerWorkspaceInit, "ImagePullBackOff")})
	return b.Build()
}

// ImageNotFound is the seed's img-missing: the workload image's tag does
// not exist.
func ImageNotFound(p Params) (*Scenario, error) {
	return workloadPullFailure("img-missing", "the workload image's tag does not exist (seed img-missing)",
		p, ImageMissing, ErrNotFound, eventpipev1.CategoryNotFound)
}

// RegistryUnauthorized: a private registry refuses the pull (no pull secret).
func RegistryUnauthorized(p Params) (*Scenario, error) {
	return workloadPullFailure("registry-unauthorized", "a private registry answers 401 (no pull secret)",
		p, ImagePrivate, ErrUnauthorized, eventpipev1.CategoryUnauthorized)
}

// RegistryUnreachable: nothing listens at the registry's address.
func RegistryUnreachable(p Params) (*Scenario, error) {
	return workloadPullFailure("registry-unreachable", "the registry refuses connections",
		p, ImageUnreachable, ErrUnreachable, eventpipev1.CategoryRegistryUnreachable)
}

// RateLimited: Docker Hub's anonymous pull limit.
func RateLimited(p Params) (*Scenario, error) {
	return workloadPullFailure("rate-limited", "Docker Hub answers 429 toomanyrequests",
		p, ImageRateLimited, ErrRateLimited, eventpipev1.CategoryRateLimited)
}

// SupervisorBadTag is the seed's sup-bad: the supervisor image's tag does
// not exist. Newer generation: the workload pod runs (1/1) and the
// supervisor pod is in ImagePullBackOff; older generation: the workload
// pod's init container openshell-supervisor-install fails instead.
func SupervisorBadTag(p Params) (*Scenario, error) {
	sb := p.sandbox("sup-bad")
	sb.SupervisorImage = SupervisorImageBad
	b := NewBuilder("sup-bad", "the supervisor image's tag does not exist (seed sup-bad)")
	createObjects(b, sb)
	if sb.HasSupervisorPod() {
		runWorkload(b, sb)
		pullFailure(b, sb, TargetSupervisorPod, ContainerSupervisor, sb.SupervisorImage, ErrNotFound(sb.SupervisorImage),
			eventpipev1.CategoryNotFound, 3)
		ready(b, sb)
	} else {
		pullFailure(b, sb, TargetWorkloadPod, ContainerSupervisorInstall, sb.SupervisorImage, ErrNotFound(sb.SupervisorImage),
			eventpipev1.CategoryNotFound, 3)
		b.SandboxConditions(sb, Condition{"Ready", "False", ReadyReasonNotReady, pendingOn(ContainerSupervisorInstall, "ImagePullBackOff")})
	}
	return b.Build()
}

// Unschedulable: no node fits the workload pod; the scheduler retries.
func Unschedulable(p Params) (*Scenario, error) {
	sb := p.sandbox("unschedulable")
	unbound := sb
	unbound.Node = ""
	b := NewBuilder("unschedulable", "no node has room for the workload pod (FailedScheduling, repeated)")
	b.Namespace(sb).SandboxCR(sb)
	b.After(150 * time.Millisecond).PVC(sb).WorkloadPod(unbound)
	b.Controller(sb, TargetSandbox, corev1.EventTypeNormal, "PodCreated", "Create", "Created Pod "+sb.PodName())
	if sb.HasSupervisorPod() {
		b.SupervisorPod(sb)
		b.After(100*time.Millisecond).Scheduler(sb, TargetSupervisorPod, corev1.EventTypeNormal, "Scheduled", "Binding",
			msgScheduled(sb.Namespace(), sb.SupervisorPodName(), sb.Node))
		runSupervisorPod(b, sb)
	}
	const note = "0/1 nodes are available: 1 Insufficient memory. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
	b.After(100 * time.Millisecond)
	fs := b.Scheduler(unbound, TargetWorkloadPod, corev1.EventTypeWarning, "FailedScheduling", "Scheduling", note,
		Blocks(eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources, true))
	b.PodStatus(unbound, TargetWorkloadPod, func(s *corev1.PodStatus) {
		s.Phase = corev1.PodPending
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: note, LastTransitionTime: metav1.Now()}}
	})
	b.SandboxConditions(sb, Condition{"Ready", "False", ReadyReasonNotReady, "Pod exists with phase: Pending"})
	b.RepeatEvery(fs, 4, 10*time.Second, true)
	return b.Build()
}

// CrashLoop: the agent container starts and exits, and the kubelet backs off.
func CrashLoop(p Params) (*Scenario, error) {
	sb := p.sandbox("crash-loop")
	sb.Image = ImageCrashingAgent
	b := NewBuilder("crash-loop", "the agent container exits at once; the kubelet restarts it with back-off")
	createObjects(b, sb)
	runSupervisorPod(b, sb)
	runInits(b, sb, "")
	b.After(400 * time.Millisecond)
	pulled := b.Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeNormal, "Pulled", msgPresent(sb.Image), NamesImage(sb.Image))
	created := b.Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeNormal, "Created", msgCreated(ContainerAgent))
	started := b.Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeNormal, "Started", msgStarted(ContainerAgent))
	b.After(time.Second)
	backoff := b.Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeWarning, "BackOff",
		fmt.Sprintf("Back-off restarting failed container %s in pod %s_%s($(UID))", ContainerAgent, sb.PodName(), sb.Namespace()),
		Blocks(eventpipev1.BlockerKindContainer, eventpipev1.BlockerExitError, false))
	interval := 10 * time.Second
	for i := range 3 {
		b.After(interval).Repeat(pulled).Repeat(created).Repeat(started)
		b.After(time.Second).Repeat(backoff)
		b.podState(sb, TargetWorkloadPod, corev1.PodRunning, map[string]cstate{ContainerAgent: {
			waitingReason: "CrashLoopBackOff", restarts: int32(i + 1), lastTerminatedReason: "Error",
			waitingMessage: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s($(UID))",
				interval*2, ContainerAgent, sb.PodName(), sb.Namespace()),
		}})
		interval *= 2
	}
	b.SandboxConditions(sb, Condition{"Ready", "False", ReadyReasonNotReady,
		fmt.Sprintf("Pod exists with phase: Running; container %q is waiting: CrashLoopBackOff", ContainerAgent)})
	return b.Build()
}

// Deletion: a healthy sandbox is deleted; the kubelet's Killing events are
// written after the pods are gone.
func Deletion(p Params) (*Scenario, error) {
	sb := p.sandbox("deletion")
	b := NewBuilder("deletion", "a running sandbox is deleted; teardown events arrive after the pods are gone")
	createObjects(b, sb)
	runSupervisorPod(b, sb)
	runWorkload(b, sb)
	ready(b, sb)
	b.After(30*time.Second).Delete(sb, TargetSandbox).Delete(sb, TargetWorkloadPod)
	if sb.HasSupervisorPod() {
		b.Delete(sb, TargetSupervisorPod)
	}
	b.Delete(sb, TargetPVC)
	b.After(200*time.Millisecond).Kubelet(sb, TargetWorkloadPod, ContainerAgent, corev1.EventTypeNormal, "Killing",
		"Stopping container "+ContainerAgent)
	if sb.HasSupervisorPod() {
		b.Kubelet(sb, TargetSupervisorPod, ContainerSupervisor, corev1.EventTypeNormal, "Killing",
			"Stopping container "+ContainerSupervisor)
	}
	return b.Build()
}

// EventBeforeObject: the scheduler's and kubelet's first events are
// written before the CR and pods exist (the watch race an agent must
// survive); their involvedObject.uid is empty because the object has none
// yet.
func EventBeforeObject(p Params) (*Scenario, error) {
	sb := p.sandbox("early-event")
	b := NewBuilder("event-before-object", "events about a pod are written before the pod and its Sandbox CR exist")
	b.Namespace(sb)
	schedule(b, sb)
	b.After(300*time.Millisecond).Kubelet(sb, TargetWorkloadPod, sb.InitContainers()[0].Name, corev1.EventTypeNormal, "Pulled",
		msgPresent(sb.InitContainers()[0].Image), NamesImage(sb.InitContainers()[0].Image))
	b.After(2 * time.Second).SandboxCR(sb)
	b.After(150 * time.Millisecond).PVC(sb).WorkloadPod(sb)
	if sb.HasSupervisorPod() {
		b.SupervisorPod(sb)
	}
	runSupervisorPod(b, sb)
	runWorkload(b, sb)
	ready(b, sb)
	return b.Build()
}

package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
)

// The blockers other than pulls, as the agent ships them: the writers'
// words (kube-scheduler, the kubelet, the Agent Sandbox controller's Ready
// condition, a pod status) and the enricher's diagnosis.

const blockedID = "5b4a3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"

// podOcc is an occurrence about the workload pod pod of blockedID.
func podOcc(pod, reason, message, component, container string) *eventpipev1.Occurrence {
	o := occurrence(blockedID, reason, container, message)
	o.Namespace = "openshell-openshell-" + pod
	o.InvolvedObject = &eventpipev1.ObjectRef{Kind: "Pod", Namespace: o.Namespace, Name: pod}
	if container != "" {
		o.InvolvedObject.FieldPath = "spec.containers{" + container + "}"
	}
	o.Sandbox.Name, o.Sandbox.CrNamespace, o.Sandbox.CrName = pod, o.Namespace, pod
	o.ReportingComponent, o.Image, o.ImageRole = component, "", ""
	return o
}

func withBlocker(o *eventpipev1.Occurrence, kind, cause, object, detail string, attempts uint32) *eventpipev1.Occurrence {
	o.Type = "Warning"
	o.Blocker = &eventpipev1.Blocker{Kind: kind, Cause: cause, Object: object, Disposition: eventpipev1.DispositionRetrying,
		Attempts: attempts, Detail: detail, Source: eventpipev1.PullSourceEvent, DecidedBy: eventpipev1.DecidedByTextRule,
		Confidence: eventpipev1.ConfidenceCertain}
	return o
}

func failedScheduling() *eventpipev1.Occurrence {
	const words = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
	return withBlocker(podOcc("no-cpu", "FailedScheduling", words, "default-scheduler", ""),
		eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources, "Pod/no-cpu", "0/1 nodes are available: 1 Insufficient cpu.", 3)
}

func scheduled() *eventpipev1.Occurrence {
	o := podOcc("no-cpu", "Scheduled", "Successfully assigned openshell-openshell-no-cpu/no-cpu to node-1", "default-scheduler", "")
	o.Progress = &eventpipev1.Progress{CompleteStep: eventpipev1.StepRequestingSandbox, ActiveStep: eventpipev1.StepPullingImage}
	return o
}

func failedMount() *eventpipev1.Occurrence {
	const words = `MountVolume.SetUp failed for volume "credentials" : secret "sandbox-credentials" not found`
	o := withBlocker(podOcc("no-secret", "FailedMount", words, "kubelet", ""),
		eventpipev1.BlockerKindVolume, eventpipev1.BlockerSecretNotFound, "Secret/sandbox-credentials", words, 4)
	o.Blocker.Disposition = eventpipev1.DispositionPersistent
	return o
}

func kubelet(pod, reason, container string) *eventpipev1.Occurrence {
	return podOcc(pod, reason, reason+" container "+container, "kubelet", container)
}

// readyCondition is the agent's sandbox condition occurrence of the
// Sandbox CR quota: with a refusal (blocker) or without (it ended).
func readyCondition(refused bool, rv int) *eventpipev1.Occurrence {
	o := podOcc("quota", "ReconcilerError", "", eventpipev1.ComponentAgent, "")
	o.InvolvedObject = &eventpipev1.ObjectRef{Kind: "Sandbox", ApiVersion: "agents.x-k8s.io/v1beta1", Namespace: o.Namespace, Name: "quota", Uid: "cr-quota"}
	o.EventId = fmt.Sprintf("%scr-quota/%d", eventpipev1.SandboxConditionEventIDPrefix, rv)
	o.Role = eventpipev1.RoleSandbox
	if !refused {
		o.Reason, o.Message = "DependenciesNotReady", "Pod exists with phase: Pending"
		return o
	}
	const words = `pods "quota" is forbidden: exceeded quota: sandbox-pods, requested: pods=1, used: pods=0, limited: pods=0`
	o.Message = "Error seen: " + words
	withBlocker(o, eventpipev1.BlockerKindCreateRefused, eventpipev1.BlockerQuotaExceeded, "ResourceQuota/sandbox-pods", words, 2)
	o.Blocker.Source = eventpipev1.PullSourceSandboxCondition
	return o
}

// crashStatus is the pod status of a crash-looping agent container.
func crashStatus(rv int) *eventpipev1.Occurrence {
	o := podOcc("crash", "CrashLoopBackOff", "back-off 20s restarting failed container=agent pod=crash_openshell-openshell-crash(p-1)", eventpipev1.ComponentAgent, "agent")
	o.EventId = fmt.Sprintf("p-1/%d/agent", rv)
	withBlocker(o, eventpipev1.BlockerKindContainer, eventpipev1.BlockerCrashLoop, "Pod/crash", "Error (exit code 1)", 3)
	o.Blocker.Container, o.Blocker.Source, o.Blocker.ExitCode, o.Blocker.HasExitCode = "agent", eventpipev1.PullSourcePodStatus, 1, true
	return o
}

func unhealthy() *eventpipev1.Occurrence {
	const words = "Readiness probe failed: cat: can't open '/tmp/ready': No such file or directory"
	o := withBlocker(podOcc("unready", "Unhealthy", words, "kubelet", "agent"),
		eventpipev1.BlockerKindContainer, eventpipev1.BlockerReadinessProbe, "Pod/unready", words, 3)
	o.Blocker.Container = "agent"
	return o
}

func livenessFailed() *eventpipev1.Occurrence {
	o := unhealthy()
	o.Message = "Liveness probe failed: HTTP probe failed with statuscode: 503"
	o.Blocker.Cause, o.Blocker.Detail = eventpipev1.BlockerLivenessProbe, o.Message
	return o
}

// containerReady is the agent's container readiness occurrence of a
// container of the workload pod pod.
func containerReady(pod, container string) *eventpipev1.Occurrence {
	o := podOcc(pod, eventpipev1.ReasonContainerReady, "container "+container+" is ready", eventpipev1.ComponentAgent, container)
	o.EventId = eventpipev1.ContainerReadyEventIDPrefix + "p-" + pod + "/7/" + container
	return o
}

// supervisorPullFailed: the supervisor pod of the sandbox cannot pull its
// image.
func supervisorPullFailed() *eventpipev1.Occurrence {
	o := supervisorFailure(blockedID)
	o.InvolvedObject.Name = "os-supervisor-" + blockedID
	o.InvolvedObject.FieldPath = "spec.containers{supervisor}"
	return o
}

// TestBlockerConditions: what each blocker adds to the DriverSandbox while
// it is active, and that it goes away when the event that ends it arrives
// (and only then); several blockers at once each have their condition.
func TestBlockerConditions(t *testing.T) {
	type step struct {
		o *eventpipev1.Occurrence
		d time.Duration // occurrence time after the start
	}
	type want struct {
		typ, reason string
		words       []string
	}
	settle := diagnosis.DefaultCrashSettle
	for _, tc := range []struct {
		name  string
		steps []step
		now   time.Duration // the proxy's clock after the start
		want  []want        // in order; none: no condition, Ready untouched
	}{
		{"unschedulable", []step{{failedScheduling(), 0}}, time.Minute,
			[]want{{ConditionScheduled, "InsufficientResources", []string{"workload pod no-cpu cannot be scheduled: insufficient_resources (retrying), 3 attempts;",
				"kubernetes: 0/1 nodes are available: 1 Insufficient cpu."}}}},
		{"unschedulable ended by Scheduled", []step{{failedScheduling(), 0}, {scheduled(), 5 * time.Second}}, time.Minute, nil},
		{"the scheduler's late series update after Scheduled", []step{{failedScheduling(), 0}, {scheduled(), 5 * time.Second}, {failedScheduling(), 4 * time.Second}}, time.Minute, nil},
		{"unschedulable again after Scheduled (a new pod)", []step{{failedScheduling(), 0}, {scheduled(), 5 * time.Second}, {failedScheduling(), 9 * time.Second}}, time.Minute,
			[]want{{ConditionScheduled, "InsufficientResources", nil}}},
		{"missing Secret", []step{{failedMount(), 0}}, time.Minute,
			[]want{{ConditionVolumes, "SecretNotFound", []string{"workload pod no-secret cannot get its volumes: secret_not_found (persistent: retrying will not fix it), 4 attempts, Secret/sandbox-credentials;",
				`kubernetes: MountVolume.SetUp failed for volume "credentials" : secret "sandbox-credentials" not found`}}}},
		{"missing Secret created: the kubelet goes on", []step{{failedMount(), 0}, {kubelet("no-secret", "Pulling", "workspace-init"), 30 * time.Second}}, time.Minute, nil},
		{"a Pulling of another pod ends nothing", []step{{failedMount(), 0}, {kubelet("no-cpu", "Pulling", "workspace-init"), 30 * time.Second}}, time.Minute,
			[]want{{ConditionVolumes, "SecretNotFound", nil}}},
		{"quota refuses the pod", []step{{readyCondition(true, 1), 0}}, time.Minute,
			[]want{{ConditionCreated, "QuotaExceeded", []string{"Sandbox/quota cannot be created: quota_exceeded (retrying), 2 attempts, ResourceQuota/sandbox-pods;",
				`kubernetes: pods "quota" is forbidden: exceeded quota: sandbox-pods`}}}},
		{"quota lifted: the Ready condition no longer says so", []step{{readyCondition(true, 1), 0}, {readyCondition(false, 2), time.Minute}}, 2 * time.Minute, nil},
		{"crash loop", []step{{crashStatus(1), 0}}, time.Minute,
			[]want{{ConditionContainers, "CrashLoop", []string{"container agent of workload pod crash does not run: crash_loop (retrying), 3 attempts, exit code 1;",
				"kubernetes: Error (exit code 1)"}}}},
		{"crash loop, started, not settled", []step{{crashStatus(1), 0}, {kubelet("crash", "Started", "agent"), 10 * time.Second}}, 10*time.Second + settle - time.Second,
			[]want{{ConditionContainers, "CrashLoop", nil}}},
		{"crash loop, started and stayed up", []step{{crashStatus(1), 0}, {kubelet("crash", "Started", "agent"), 10 * time.Second}}, 10*time.Second + settle, nil},
		{"crash loop, started and crashed again", []step{{crashStatus(1), 0}, {kubelet("crash", "Started", "agent"), 10 * time.Second}, {crashStatus(2), 12 * time.Second}},
			10*time.Second + 2*settle, []want{{ConditionContainers, "CrashLoop", nil}}},
		{"readiness probe", []step{{unhealthy(), 0}}, time.Minute,
			[]want{{ConditionContainers, "ReadinessProbeFailed", []string{"container agent of workload pod unready is not ready: readiness_probe_failed (retrying), 3 attempts;",
				"kubernetes: Readiness probe failed: cat: can't open '/tmp/ready'"}}}},
		{"readiness probe passes again: the agent's container readiness", []step{{unhealthy(), 0}, {containerReady("unready", "agent"), 20 * time.Second}}, time.Minute, nil},
		{"ready in the second of the last failure", []step{{unhealthy(), 0}, {containerReady("unready", "agent"), 0}}, time.Minute, nil},
		{"readiness probe fails again after it", []step{{unhealthy(), 0}, {containerReady("unready", "agent"), 20 * time.Second}, {unhealthy(), 30 * time.Second}}, time.Minute,
			[]want{{ConditionContainers, "ReadinessProbeFailed", nil}}},
		{"another container ready", []step{{unhealthy(), 0}, {containerReady("unready", "sidecar"), 20 * time.Second}}, time.Minute,
			[]want{{ConditionContainers, "ReadinessProbeFailed", nil}}},
		{"liveness probe: no condition (its restart shows as a crash loop)", []step{{livenessFailed(), 0}}, time.Minute, nil},
		{"supervisor image and unschedulable workload pod", []step{{failedScheduling(), 0}, {supervisorPullFailed(), time.Second}}, time.Minute,
			[]want{{ConditionImage, "NotFound", []string{"supervisor image ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist cannot be pulled"}},
				{ConditionScheduled, "InsufficientResources", nil}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHub(t, nil)
			start := time.Unix(1_790_000_000, 0)
			h.now = func() time.Time { return start.Add(tc.now) }
			for i, st := range tc.steps {
				o := at(st.o, st.d)
				o.EventId = fmt.Sprintf("%s#%d", o.EventId, i)
				h.apply(uint64(i+1), o, false)
			}
			p, ok := h.patchFor(blockedID)
			if len(tc.want) == 0 {
				if ok || !p.Empty() || h.anyBlocked() {
					t.Errorf("patch %+v (blocked %v), want none", p, h.anyBlocked())
				}
				return
			}
			if !ok || len(p.Add) != len(tc.want) {
				t.Fatalf("conditions %+v, want %d", p.Add, len(tc.want))
			}
			for i, w := range tc.want {
				c := p.Add[i]
				if c.Type != w.typ || c.Status != "False" || c.Reason != w.reason || c.LastTransitionTime == "" {
					t.Errorf("condition %d: %+v, want %s=False reason %s", i, c, w.typ, w.reason)
				}
				for _, word := range w.words {
					if !strings.Contains(c.Message, word) {
						t.Errorf("condition %s: message %q lacks %q", c.Type, c.Message, word)
					}
				}
				if !strings.Contains(p.ReadySuffix, readySuffixPrefix+c.Message) {
					t.Errorf("Ready suffix %q lacks condition %s", p.ReadySuffix, c.Type)
				}
			}
			if !strings.HasPrefix(p.ReadySuffix, readySuffixPrefix+p.Add[0].Message) {
				t.Errorf("Ready suffix %q does not lead with the first condition", p.ReadySuffix)
			}
		})
	}
}

// TestBlockerSettlesByTheClock: a crash-loop condition whose container has
// stayed up since its Started goes away at the settle time without any
// further occurrence, and the gauges follow.
func TestBlockerSettlesByTheClock(t *testing.T) {
	h := testHub(t, nil)
	start := time.Unix(1_790_000_000, 0)
	now := start.Add(20 * time.Second)
	h.now = func() time.Time { return now }
	h.apply(1, at(crashStatus(1), 0), false)
	h.apply(2, at(kubelet("crash", "Started", "agent"), 10*time.Second), false)
	if _, ok := h.patchFor(blockedID); !ok || !h.anyBlocked() {
		t.Fatal("the crash loop is not shown before it settled")
	}
	now = start.Add(10*time.Second + diagnosis.DefaultCrashSettle)
	if p, ok := h.patchFor(blockedID); ok {
		t.Errorf("settled, still shown: %+v", p)
	}
	if h.anyBlocked() || h.blocked != 0 {
		t.Errorf("settled, still counted: blocked %d", h.blocked)
	}
}

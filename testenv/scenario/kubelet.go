package scenario

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Messages as kubelet v1.37, default-scheduler and containerd 2.x write them.
func msgScheduled(ns, pod, node string) string {
	return fmt.Sprintf("Successfully assigned %s/%s to %s", ns, pod, node)
}
func msgPulling(image string) string { return fmt.Sprintf("Pulling image %q", image) }
func msgPulled(image string) string {
	return fmt.Sprintf("Successfully pulled image %q in 2.915s (2.915s including waiting). Image size: 2155861 bytes.", image)
}
func msgPresent(image string) string {
	return fmt.Sprintf("Container image %q already present on machine", image)
}
func msgCreated(c string) string { return "Created container: " + c }
func msgStarted(c string) string { return "Started container " + c }
func msgFailedPull(image, runtimeErr string) string {
	return fmt.Sprintf("Failed to pull image %q: %s", image, runtimeErr)
}
func msgBackOffPull(image string) string { return fmt.Sprintf("Back-off pulling image %q", image) }

// Runtime (containerd via CRI) pull errors, as the kubelet quotes them.

// ErrNotFound is containerd's answer for a tag that does not exist (the
// seed img-missing's exact text).
func ErrNotFound(image string) string {
	return fmt.Sprintf("rpc error: code = NotFound desc = failed to pull and unpack image %q: failed to resolve reference %q: %s: not found", image, image, image)
}

// ErrUnauthorized is a private registry refusing an anonymous pull.
func ErrUnauthorized(image string) string {
	host, repo, tag := splitImage(image)
	return fmt.Sprintf("rpc error: code = Unknown desc = failed to pull and unpack image %q: failed to resolve reference %q: unexpected status from HEAD request to https://%s/v2/%s/manifests/%s: 401 Unauthorized", image, image, host, repo, tag)
}

// ErrUnreachable is a registry nobody listens for.
func ErrUnreachable(image string) string {
	host, repo, tag := splitImage(image)
	return fmt.Sprintf("rpc error: code = Unknown desc = failed to pull and unpack image %q: failed to resolve reference %q: failed to do request: Head \"https://%s/v2/%s/manifests/%s\": dial tcp 10.96.12.7:5000: connect: connection refused", image, image, host, repo, tag)
}

// ErrRateLimited is Docker Hub's anonymous pull limit.
func ErrRateLimited(image string) string {
	_, repo, _ := splitImage(image)
	return fmt.Sprintf("rpc error: code = Unknown desc = failed to pull and unpack image %q: failed to copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/%s/manifests/sha256:7c1c4f2b0d6f5b8e2a9a3e0f6d2b1c4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c: 429 Too Many Requests - Server message: toomanyrequests: You have reached your unauthenticated pull rate limit. https://www.docker.com/increase-rate-limit", image, repo)
}

// splitImage splits host/repo:tag (docker.io default host, library/ for
// one-element Docker Hub names, latest default tag).
func splitImage(image string) (host, repo, tag string) {
	rest := image
	if i := strings.IndexByte(rest, '/'); i > 0 && strings.ContainsAny(rest[:i], ".:") {
		host, rest = rest[:i], rest[i+1:]
	} else {
		host = "docker.io"
	}
	tag = "latest"
	if i := strings.LastIndexByte(rest, ':'); i > 0 {
		rest, tag = rest[:i], rest[i+1:]
	}
	if host == "docker.io" && !strings.Contains(rest, "/") {
		rest = "library/" + rest
	}
	return host, rest, tag
}

// cstate is one container's state in a pod status.
type cstate struct {
	waitingReason, waitingMessage string
	running                       bool
	terminatedReason              string
	exitCode                      int32
	restarts                      int32
	lastTerminatedReason          string
	// lastExitCode of the last termination; 0 means the kubelet's usual
	// code for lastTerminatedReason (137 for OOMKilled, else 1).
	lastExitCode int32
}

// exitCodeFor is the last termination's exit code of st.
func (st cstate) exitCodeFor() int32 {
	switch {
	case st.lastExitCode != 0:
		return st.lastExitCode
	case st.lastTerminatedReason == "OOMKilled":
		return 137
	}
	return 1
}

// podStatus builds a pod status: containers not in states are init
// containers that completed (before the first waiting init container) or
// are waiting PodInitializing, and main containers running unless an init
// container has not completed.
func podStatus(sb Sandbox, target Target, phase corev1.PodPhase, states map[string]cstate) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		at := metav1.Now()
		s.Phase = phase
		var inits, mains []corev1.Container
		if target == TargetSupervisorPod {
			mains = sb.SupervisorPod("").Spec.Containers
		} else {
			inits = sb.InitContainers()
			mains = []corev1.Container{{Name: ContainerAgent, Image: sb.Image}}
		}
		initsDone := true
		for _, c := range inits {
			st, ok := states[c.Name]
			if !ok {
				if initsDone {
					st = cstate{terminatedReason: "Completed"}
				} else {
					st = cstate{waitingReason: "PodInitializing"}
				}
			}
			if st.terminatedReason != "Completed" {
				initsDone = false
			}
			s.InitContainerStatuses = append(s.InitContainerStatuses, containerStatus(c, st, at))
		}
		allReady := initsDone
		for _, c := range mains {
			st, ok := states[c.Name]
			if !ok {
				if initsDone {
					st = cstate{running: true}
				} else {
					st = cstate{waitingReason: "PodInitializing"}
				}
			}
			if !st.running {
				allReady = false
			}
			s.ContainerStatuses = append(s.ContainerStatuses, containerStatus(c, st, at))
		}
		cond := func(t corev1.PodConditionType, ok bool, reason string) corev1.PodCondition {
			c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, LastTransitionTime: at}
			if ok {
				c.Status, c.Reason = corev1.ConditionTrue, ""
			}
			return c
		}
		s.Conditions = append(s.Conditions,
			cond(corev1.PodInitialized, initsDone, "ContainersNotInitialized"),
			cond(corev1.ContainersReady, allReady, "ContainersNotReady"),
			cond(corev1.PodReady, allReady, "ContainersNotReady"),
		)
		if allReady {
			s.PodIP = "10.244.0.17"
			s.PodIPs = []corev1.PodIP{{IP: s.PodIP}}
		}
	}
}

func containerStatus(c corev1.Container, st cstate, at metav1.Time) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, RestartCount: st.restarts}
	switch {
	case st.running:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: at}
		cs.Ready = true
		t := true
		cs.Started = &t
	case st.terminatedReason != "":
		cs.State.Terminated = &corev1.ContainerStateTerminated{Reason: st.terminatedReason, ExitCode: st.exitCode,
			StartedAt: metav1.NewTime(at.Add(-2 * time.Second)), FinishedAt: metav1.NewTime(at.Add(-time.Second))}
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: st.waitingReason, Message: st.waitingMessage}
	}
	if cs.State.Running != nil || cs.State.Terminated != nil {
		cs.ImageID = "docker.io/library/sha256:4b8f0fd8f3e1d3ac2f0ba45f1e1d28b8c3d1ef7a3c9c0f1b2a3d4e5f60718293"
		cs.ContainerID = "containerd://" + strings.Repeat("ab", 32)
	}
	if st.lastTerminatedReason != "" {
		cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: st.lastTerminatedReason, ExitCode: st.exitCodeFor(),
			StartedAt: metav1.NewTime(at.Add(-5 * time.Second)), FinishedAt: metav1.NewTime(at.Add(-4 * time.Second)),
			ContainerID: "containerd://" + strings.Repeat("cd", 32)}
	}
	return cs
}

// podState writes a pod status built by podStatus.
func (b *Builder) podState(sb Sandbox, target Target, phase corev1.PodPhase, states map[string]cstate) *Builder {
	return b.PodStatus(sb, target, podStatus(sb, target, phase, states))
}

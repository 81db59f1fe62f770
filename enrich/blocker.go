package enrich

import (
	"strconv"
	"strings"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Blockers are what keeps a pod from running other than an image pull (see
// Occurrence.blocker): the scheduler finds no node, a volume is not bound,
// attached or mounted, the API server refuses the pod, or a container cannot
// start or keeps dying. Classification is by reason first (a switch on a few
// strings, so ordinary events cost a length compare or two), then by the
// message's words.

// blockerClass is what one (reason, message) says.
type blockerClass struct {
	kind, cause, object, detail string
	// weak: a restart back-off that names no cause of its own; it inherits
	// the container's last known cause (OOMKilled, an exit code).
	weak bool
	// lasting: the signal is a blocker only once it lasts (a probe that
	// keeps failing, a provisioner that never acts); the tracker counts it
	// and recordBlocker decides (lasting in blocker_occurrence.go).
	lasting bool
	// strength is how sure the cause is: certain when a rule or a status
	// field names it, likely when only the reason does (a
	// RunContainerError whose words no rule reads), weak for unknown and
	// unrecognised.
	strength strength
}

// ClassifyBlocker classifies one (reason, message) pair from an Event or a
// container's waiting state; ok=false when it is no blocker. kind and cause
// are Blocker* constants; object is the Kubernetes object the message names
// as "<Kind>/<name>" (empty when it names none); detail is the message's
// most specific words.
func ClassifyBlocker(reason, message string) (kind, cause, object, detail string, ok bool) {
	if len(message) > maxClassifyBytes {
		message = message[:maxClassifyBytes]
	}
	b, ok := classifyBlocker(reason, message)
	return b.kind, b.cause, b.object, b.detail, ok
}

func classifyBlocker(reason, msg string) (blockerClass, bool) {
	b, ok := blockerRule(oldReason(reason), msg)
	if b.cause == eventpipev1.BlockerUnknown || b.cause == eventpipev1.BlockerUnrecognised {
		b.strength = weak
	}
	return b, ok
}

// blockerRule is classifyBlocker's table of reasons and words.
func blockerRule(reason, msg string) (blockerClass, bool) {
	switch reason {
	case "FailedScheduling":
		if hasPrefixFold(msg, "skip schedule deleting pod") {
			// The scheduler drops a pod that is being deleted: nothing
			// blocks it.
			return blockerClass{}, false
		}
		cause, detail := schedulingCause(msg)
		return blockerClass{kind: eventpipev1.BlockerKindUnschedulable, cause: cause, detail: detail}, true
	case "NodeAffinity", "TaintToleration", "NodePorts", "NodeName", "MatchNodeSelector", "PodToleratesNodeTaints",
		"PodFitsHostPorts", "HostName":
		// kubelet's admission refused a pod bound to its node: "Predicate
		// NodeAffinity failed: node(s) didn't match Pod's node
		// affinity/selector" (before 1.18 "Predicate MatchNodeSelector
		// failed"). The pod fails; its controller must place a new one.
		if hasPrefixFold(msg, "predicate ") {
			c := schedulingItemCause(msg)
			if c == "" {
				c = eventpipev1.BlockerUnknown
			}
			return blockerClass{kind: eventpipev1.BlockerKindUnschedulable, cause: c, detail: blockerDetail(msg)}, true
		}
	case "FailedBinding":
		// The PV controller cannot bind the claim: no class and no volume,
		// or the volume its volumeName names is bound to another claim.
		b := blockerClass{kind: eventpipev1.BlockerKindVolume, cause: eventpipev1.BlockerUnboundPVC, detail: blockerDetail(msg)}
		if containsFold(msg, "no storage class is set") {
			b.cause = eventpipev1.BlockerNoStorageClass
		}
		return b, true
	case "VolumeMismatch":
		// The PV controller: the claim names a volume (volumeName) it
		// cannot bind to ("Cannot bind to requested volume \"pv\":
		// requested PV is too small", "... incompatible accessMode",
		// "... storageClassName does not match", volumeMode).
		return blockerClass{kind: eventpipev1.BlockerKindVolume, cause: eventpipev1.BlockerUnboundPVC, detail: blockerDetail(msg)}, true
	case "ProvisioningFailed":
		b := blockerClass{kind: eventpipev1.BlockerKindVolume, cause: eventpipev1.BlockerProvisioningFailed, detail: blockerDetail(msg)}
		if name, ok := quotedAfter(msg, `storageclass.storage.k8s.io "`); ok && containsFold(msg, "not found") {
			b.cause, b.object = eventpipev1.BlockerStorageClassNotFound, "StorageClass/"+name
		} else if name, ok := quotedAfter(msg, `StorageClass "`); ok {
			b.object = "StorageClass/" + name
		}
		return b, true
	case "FailedAttachVolume", "VolumeAttachmentLimitExceeded":
		// The second is kubelet rejecting a pod when the node cannot
		// attach another volume (1.3x).
		return blockerClass{kind: eventpipev1.BlockerKindVolume, cause: eventpipev1.BlockerAttachFailed, detail: blockerDetail(msg)}, true
	case "FailedMount", "FailedMapVolume":
		// FailedMapVolume is the mount of a raw block volume.
		b := blockerClass{kind: eventpipev1.BlockerKindVolume, cause: eventpipev1.BlockerMountFailed, detail: blockerDetail(msg)}
		switch {
		case hasPrefixFold(msg, "failed to attach volume "), hasPrefixFold(msg, "attachvolume.attach failed"):
			// Before attach failures got a reason of their own, the
			// attach/detach controller recorded them as FailedMount:
			// "Failed to attach volume %q on node %q with: %v" (1.4-1.7),
			// then "AttachVolume.Attach failed for volume %q : %v".
			b.cause = eventpipev1.BlockerAttachFailed
		case missingObject(msg, &b):
		case containsFold(msg, "non-existent config key"), containsFold(msg, "non-existent secret key"):
			// The configmap and secret volume plugins: an item of the
			// volume names a key the object lacks.
			b.cause = eventpipev1.BlockerKeyNotFound
		case containsFold(msg, `serviceaccounts "`) && containsFold(msg, "not found"):
			// The projected token volume: kubelet's token manager cannot
			// get a token for a ServiceAccount that no longer exists
			// ("failed to fetch token: serviceaccounts \"x\" not found").
			b.cause = eventpipev1.BlockerServiceAccountMissing
			if name, ok := quotedAfter(msg, `serviceaccounts "`); ok {
				b.object = "ServiceAccount/" + name
			}
		case containsFold(msg, "error processing pvc"):
			// kubelet's volume populator cannot use the claim ("error
			// processing PVC ns/x: PVC is not bound", "... is being
			// deleted", "failed to fetch PVC from API server: ... not
			// found", or its PV is gone), reported at the end of the wait.
			b.cause = eventpipev1.BlockerUnboundPVC
		case containsFold(msg, "object cache"), containsFold(msg, " cache: "):
			// kubelet's Secret and ConfigMap managers could not get the
			// object from the API server in time ("couldn't propagate
			// object cache: timed out waiting for the condition" 1.12-1.13,
			// "failed to sync secret cache: ..." since 1.14): the wait was
			// the cache's, not the one for the pod's volumes.
		case containsFold(msg, "timed out waiting for the condition"), containsFold(msg, "timeout expired waiting for volumes"),
			hasPrefixFold(msg, "unable to attach or mount volumes"):
			// kubelet's wait for the pod's volumes ended (since 1.18
			// "Unable to attach or mount volumes: unmounted volumes=[...]
			// ...: <the wait's error>", which is "context deadline
			// exceeded" in 1.3x).
			b.cause = eventpipev1.BlockerMountTimeout
		}
		return b, true
	case "FailedCreate":
		return createRefused(msg), true
	case "BackOff":
		// "Back-off restarting failed container[ x in pod y]", and the
		// 1.3-1.4 "Back-off restarting failed docker container".
		if containsFold(msg, "restarting failed") {
			return crashLoop(msg), true
		}
	case "CrashLoopBackOff":
		return crashLoop(msg), true
	case "NotTriggerScaleUp":
		// The cluster autoscaler will not add a node for the pod: "pod
		// didn't trigger scale-up: 1 node(s) had untolerated taint(s), 3
		// max node group size reached" (its own reasons beside the
		// scheduler's, per node group), before 1.13 "pod didn't trigger
		// scale-up (it wouldn't fit if a new node is added)".
		cause, detail := schedulingCause(msg)
		return blockerClass{kind: eventpipev1.BlockerKindUnschedulable, cause: cause, detail: detail}, true
	case "FailedSync":
		// Kubelets before 1.5 wrapped every pod worker error in FailedSync.
		if containsFold(msg, "crashloopbackoff") {
			return crashLoop(msg), true
		}
		// `failed to "StartContainer" for "x" with RunContainerError: "..."`
		// (or CreateContainerConfigError, CreateContainerError, and the
		// docker manager's VerifyNonRootError up to 1.5): the container's
		// own error, whatever it names.
		for _, r := range [...]string{"RunContainerError", "CreateContainerConfigError", "CreateContainerError", "VerifyNonRootError"} {
			if i := strings.Index(msg, r); i >= 5 && msg[i-5:i] == "with " {
				return containerError(r, msg)
			}
		}
		if strings.Contains(msg, genConfigFailed) {
			// 1.5-1.7: `... with <the error>: "Generate Container Config
			// Failed"`, reason and message the wrong way round.
			return containerError("CreateContainerConfigError", msg)
		}
		b := blockerClass{kind: eventpipev1.BlockerKindVolume, detail: blockerDetail(msg)}
		if containsFold(msg, "timeout expired waiting for volumes") {
			b.cause = eventpipev1.BlockerMountTimeout
			return b, true
		}
		if missingObject(msg, &b) {
			return b, true
		}
		if hasSuffixFold(strings.TrimSpace(msg), "exit status 32") {
			// mount(8) exits 32 on a mount failure; these kubelets passed
			// the volume plugin's error up bare.
			b.cause = eventpipev1.BlockerMountFailed
			return b, true
		}
	case "FailedPostStartHook", "PostStartHookError", "PreStartHookError", "PreCreateHookError":
		// A lifecycle hook failed: kubelet kills the container (postStart)
		// or never starts it. The event (since 1.2x "PostStartHook
		// failed") and the waiting reason with the hook's output.
		return blockerClass{kind: eventpipev1.BlockerKindContainer, cause: eventpipev1.BlockerStartFailed, detail: blockerDetail(reason + ": " + msg)}, true
	case "Failed", "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "StartError", "VerifyNonRootError":
		// VerifyNonRootError: the waiting reason of kubelet's docker
		// manager (before the CRI, up to 1.5) for a runAsNonRoot refusal.
		return containerError(reason, msg)
	default:
		if msg == genConfigFailed {
			// kubelet 1.5-1.7 put the container config error in the
			// waiting reason and this constant in the message (swapped
			// back in 1.8).
			return containerError("CreateContainerConfigError", reason)
		}
		// kubelet's admission: OutOfcpu, OutOfmemory, OutOfpods,
		// OutOfephemeral-storage, OutOf<extended resource>, with "Node
		// didn't have enough resource: cpu, requested: ...".
		if strings.HasPrefix(reason, "OutOf") && containsFold(msg, "didn't have enough resource") {
			return blockerClass{kind: eventpipev1.BlockerKindUnschedulable, cause: eventpipev1.BlockerInsufficientResources, detail: blockerDetail(msg)}, true
		}
	}
	return blockerClass{}, false
}

// oldReason maps the lower-camel-case reasons of Kubernetes 1.0 (the
// scheduler's "failedScheduling", the kubelet's "failedSync",
// "failedMount", "unhealthy", "killing"; CamelCase since mid-2015) to
// today's spelling.
func oldReason(reason string) string {
	if reason == "" || reason[0] < 'a' || reason[0] > 'z' {
		return reason
	}
	switch reason {
	case "failedScheduling":
		return "FailedScheduling"
	case "failedSync":
		return "FailedSync"
	case "failedMount":
		return "FailedMount"
	case "unhealthy":
		return "Unhealthy"
	case "killing":
		return "Killing"
	}
	return reason
}

// probeFailureThreshold is the kubelet's default failureThreshold: a
// probe that failed this often within the window has made the container
// unready (or restarted it); fewer failures are transient.
const probeFailureThreshold = 3

// ClassifyLasting classifies the signals that are blockers only once they
// last (see classifyLasting): kind and cause as ClassifyBlocker's,
// ok=false for any other message.
func ClassifyLasting(reason, message string) (kind, cause, detail string, ok bool) {
	if len(message) > maxClassifyBytes {
		message = message[:maxClassifyBytes]
	}
	b, ok := classifyLasting(reason, message)
	return b.kind, b.cause, b.detail, ok
}

// classifyLasting reads the signals that are no blocker by themselves but
// become one when they last: the kubelet's probe failures (Unhealthy
// "Readiness probe failed: <the probe's output>", "... probe errored:
// <why it could not run>"; Killing "Container x failed liveness probe,
// will be restarted", before 1.16 "Killing container with id
// docker://x:Container failed liveness probe.. Container will be killed
// and recreated.") and the PV controller's ExternalProvisioning ("waiting
// for a volume to be created, either by external provisioner \"x\" or
// manually created by system administrator"). The detail is the runtime's
// words; the object, for a provisioner, the provisioner it waits on.
func classifyLasting(reason, msg string) (blockerClass, bool) {
	switch oldReason(reason) {
	case "Unhealthy":
		for _, p := range [...]struct{ prefix, cause string }{
			{"readiness probe ", eventpipev1.BlockerReadinessProbe},
			{"liveness probe ", eventpipev1.BlockerLivenessProbe},
			{"startup probe ", eventpipev1.BlockerStartupProbe},
		} {
			if hasPrefixFold(msg, p.prefix) && (hasPrefixFold(msg[len(p.prefix):], "failed") || hasPrefixFold(msg[len(p.prefix):], "errored")) {
				return blockerClass{kind: eventpipev1.BlockerKindContainer, cause: p.cause, detail: blockerDetail(msg), lasting: true}, true
			}
		}
	case "Killing":
		switch {
		case containsFold(msg, "failed liveness probe"):
			return blockerClass{kind: eventpipev1.BlockerKindContainer, cause: eventpipev1.BlockerLivenessProbe, detail: blockerDetail(msg), lasting: true}, true
		case containsFold(msg, "failed startup probe"):
			return blockerClass{kind: eventpipev1.BlockerKindContainer, cause: eventpipev1.BlockerStartupProbe, detail: blockerDetail(msg), lasting: true}, true
		}
	case "ExternalProvisioning":
		b := blockerClass{kind: eventpipev1.BlockerKindVolume, cause: eventpipev1.BlockerProvisionerWaiting, detail: blockerDetail(msg), lasting: true}
		for _, p := range [...]string{`external provisioner "`, `external provisioner '`} {
			if i := indexFold(msg, p); i >= 0 {
				rest := msg[i+len(p):]
				if j := strings.IndexByte(rest, p[len(p)-1]); j > 0 {
					b.object = "StorageClassProvisioner/" + rest[:j]
				}
				break
			}
		}
		return b, true
	}
	return blockerClass{}, false
}

// genConfigFailed is the waiting message of kubelet 1.5-1.7 whose reason
// was the container config error itself.
const genConfigFailed = "Generate Container Config Failed"

// missingObject sets b's cause and object when msg says a Secret or
// ConfigMap the pod needs does not exist (kubelet's `secret "x" not found`,
// `secrets "x" not found` before 1.10, and the same for config maps). A
// message cut right after `... "x" not` (a report's paste, a column width)
// counts when "not" follows that object's name at the very end.
func missingObject(msg string, b *blockerClass) bool {
	notFound := containsFold(msg, "not found")
	end := strings.TrimSpace(msg)
	if !notFound && !hasSuffixFold(end, `" not`) {
		return false
	}
	for _, m := range [...]struct{ prefix, cause, kind string }{
		{`secret "`, eventpipev1.BlockerSecretNotFound, "Secret/"},
		{`secrets "`, eventpipev1.BlockerSecretNotFound, "Secret/"},
		{`configmap "`, eventpipev1.BlockerConfigMapNotFound, "ConfigMap/"},
		{`configmaps "`, eventpipev1.BlockerConfigMapNotFound, "ConfigMap/"},
		// Quoted again by an outer %q (the 1.5-1.8 pod worker's
		// `with RunContainerError: "... secrets \"x\" not found"`).
		{`secrets \"`, eventpipev1.BlockerSecretNotFound, "Secret/"},
		{`secret \"`, eventpipev1.BlockerSecretNotFound, "Secret/"},
		{`configmaps \"`, eventpipev1.BlockerConfigMapNotFound, "ConfigMap/"},
		{`configmap \"`, eventpipev1.BlockerConfigMapNotFound, "ConfigMap/"},
	} {
		name, ok := quotedAfter(msg, m.prefix)
		name = strings.TrimSuffix(name, `\`)
		if !ok || name == "" || !notFound && !hasSuffixFold(end, m.prefix+name+`" not`) {
			continue
		}
		b.cause, b.object = m.cause, m.kind+name
		return true
	}
	return false
}

func crashLoop(msg string) blockerClass {
	return blockerClass{kind: eventpipev1.BlockerKindContainer, cause: eventpipev1.BlockerCrashLoop, detail: blockerDetail(msg), weak: true}
}

// containerError: kubelet's Failed "Error: ..." and the waiting reasons of a
// container that cannot be created or started.
func containerError(reason, msg string) (blockerClass, bool) {
	b := blockerClass{kind: eventpipev1.BlockerKindContainer, detail: blockerDetail(msg)}
	switch {
	case containsFold(msg, "cannot find volume"), containsFold(msg, "failed to prepare subpath"):
		// kubelet's makeMounts: the container mounts a volume the pod has
		// not (yet) got, or a subPath kubelet cannot prepare. Reported as
		// the container's error (CreateContainerConfigError), so the kind
		// stays container.
		b.cause = eventpipev1.BlockerMountFailed
		return b, true
	case containsFold(msg, "couldn't find key"):
		b.cause = eventpipev1.BlockerKeyNotFound
		for _, in := range [...]struct{ sep, kind string }{{" in Secret ", "Secret/"}, {" in ConfigMap ", "ConfigMap/"}} {
			if i := strings.Index(msg, in.sep); i >= 0 {
				ref := firstWord(msg[i+len(in.sep):])
				if j := strings.LastIndexByte(ref, '/'); j >= 0 {
					ref = ref[j+1:]
				}
				b.object = in.kind + ref
			}
		}
		return b, true
	case missingObject(msg, &b):
		return b, true
	case containsFold(msg, "executable file not found"), containsFold(msg, "exec format error"),
		containsFold(msg, "failed to create containerd task"), containsFold(msg, "failed to start container"),
		containsFold(msg, "cannot start container"), containsFold(msg, "oci runtime create failed"),
		containsFold(msg, "runc create failed"), containsFold(msg, "error during container init"),
		containsFold(msg, "container create failed"), // CRI-O
		// runc's and Docker's older words, containerd's container and spec
		// creation.
		containsFold(msg, "starting container process"), containsFold(msg, "not found or does not exist"),
		containsFold(msg, "failed to create containerd container"), containsFold(msg, "failed to generate container"),
		nonRootRefusal(msg):
		b.cause = eventpipev1.BlockerStartFailed
		return b, true
	}
	switch reason {
	case "RunContainerError", "StartError", "CreateContainerError", "VerifyNonRootError":
		// The reason says the start failed; no rule read why.
		b.cause, b.strength = eventpipev1.BlockerStartFailed, likely
		return b, true
	case "CreateContainerConfigError":
		b.cause = eventpipev1.BlockerUnknown
		return b, true
	}
	return blockerClass{}, false
}

// nonRootRefusal: kubelet's verifyRunAsNonRoot refuses a container whose
// securityContext sets runAsNonRoot: "container has runAsNonRoot and image
// will run as root", "... and image has non-numeric user (x), cannot
// verify user is non-root", "... and image has an invalid user id",
// "container's runAsUser breaks non-root policy", and on Windows
// "container's runAsUser (ContainerAdministrator) which will be regarded
// as root identity and will break non-root policy" (and runAsUserName).
// kubelet's docker manager and rkt runtime before the CRI (up to 1.5)
// said "container has no runAsUser and image will run as root". kubelet never creates the container
// (CreateContainerConfigError, Failed "Error: ...", before 1.8 Failed
// "Failed to create container with error: ...").
func nonRootRefusal(msg string) bool {
	return containsFold(msg, "has runasnonroot and image") || containsFold(msg, "non-root policy") ||
		containsFold(msg, "image will run as root")
}

// createFamilies are the causes of a refused creation and the words of
// each (see createRefused). A message normally names one; when it names
// two, the answer is unrecognised.
var createFamilies = [...]struct {
	cause string
	match func(string) bool
}{
	{eventpipev1.BlockerQuotaExceeded, func(msg string) bool {
		// ResourceQuota admission: over the limit; "failed quota: q: must
		// specify ..." (a quota on a resource the pod does not request);
		// "status unknown for quota" (its usage not computed yet);
		// "insufficient quota to consume" (a limited resource no quota
		// covers).
		return containsFold(msg, "exceeded quota") || containsFold(msg, "failed quota") || containsFold(msg, " quota is ") ||
			containsFold(msg, "status unknown for quota") || containsFold(msg, "insufficient quota to consume")
	}},
	{eventpipev1.BlockerPodSecurity, func(msg string) bool {
		// "no providers available" is PodSecurityPolicy admission (before
		// 1.25) when no policy the pod's creator or service account may
		// use admits it; the last two are OpenShift's SCC admission
		// ("unable to validate against any security context constraint:
		// [...]", "no SecurityContextConstraintsProvider available").
		return containsFold(msg, "violates podsecurity") || containsFold(msg, "pod security policy") || containsFold(msg, "podsecuritypolicy") ||
			containsFold(msg, "no providers available to validate pod request") ||
			containsFold(msg, "security context constraint") || containsFold(msg, "securitycontextconstraints")
	}},
	{eventpipev1.BlockerWebhookDenied, func(msg string) bool {
		return containsFold(msg, "admission webhook") && containsFold(msg, "denied the request")
	}},
	{eventpipev1.BlockerWebhookFailed, func(msg string) bool {
		return containsFold(msg, "failed calling webhook") || containsFold(msg, "failed to call webhook") ||
			containsFold(msg, "failed calling admission webhook") || containsFold(msg, "request did not complete within")
	}},
	{eventpipev1.BlockerLimitRange, func(msg string) bool {
		return containsFold(msg, "usage per container") || containsFold(msg, "usage per pod") || containsFold(msg, "limitrange") ||
			containsFold(msg, "limit to request ratio per")
	}},
	{eventpipev1.BlockerServiceAccountMissing, func(msg string) bool {
		return (containsFold(msg, "serviceaccount") || containsFold(msg, "service account")) && containsFold(msg, "not found")
	}},
	{eventpipev1.BlockerNamespaceTerminating, func(msg string) bool {
		// NamespaceLifecycle: "unable to create new content in namespace
		// <ns> because it is being terminated".
		return containsFold(msg, "because it is being terminated")
	}},
}

// createRefused: a controller's FailedCreate (replicaset, statefulset,
// job, the Agent Sandbox controller): the API server refused the pod. The
// first family that matches is the cause; a second family matching too is
// a disagreement (unrecognised), except that a webhook that failed or
// denied the request may quote whatever it checked.
func createRefused(msg string) blockerClass {
	b := blockerClass{kind: eventpipev1.BlockerKindCreateRefused, cause: eventpipev1.BlockerUnknown, detail: blockerDetail(msg), strength: weak}
	for _, f := range createFamilies {
		if !f.match(msg) {
			continue
		}
		switch b.cause {
		case eventpipev1.BlockerUnknown:
			b.cause, b.strength = f.cause, certain
			continue
		case eventpipev1.BlockerWebhookDenied, eventpipev1.BlockerWebhookFailed:
			continue
		}
		if f.cause == eventpipev1.BlockerWebhookDenied || f.cause == eventpipev1.BlockerWebhookFailed {
			// The webhook's own words decide over what it quotes.
			b.cause = f.cause
			continue
		}
		return blockerClass{kind: b.kind, cause: eventpipev1.BlockerUnrecognised, detail: b.detail, strength: weak}
	}
	switch b.cause {
	case eventpipev1.BlockerQuotaExceeded:
		for _, p := range [...]string{"exceeded quota: ", "Exceeded quota: ", "failed quota: ", "for quota: "} {
			if i := strings.Index(msg, p); i >= 0 {
				name := msg[i+len(p):]
				if j := strings.IndexAny(name, ",: "); j >= 0 {
					name = name[:j]
				}
				if name != "" {
					b.object = "ResourceQuota/" + name
				}
				break
			}
		}
	case eventpipev1.BlockerWebhookDenied, eventpipev1.BlockerWebhookFailed:
		// The API server names the webhook (its name in the
		// Validating/MutatingWebhookConfiguration): `admission webhook
		// "x" denied the request: ...`, `failed calling webhook "x": ...`.
		for _, p := range [...]string{`admission webhook "`, `failed calling webhook "`, `failed calling admission webhook "`, `failed to call webhook "`} {
			if name, ok := quotedAfter(msg, p); ok {
				b.object = "AdmissionWebhook/" + name
				break
			}
		}
	case eventpipev1.BlockerServiceAccountMissing:
		if name, ok := quotedAfter(msg, `serviceaccount "`); ok {
			b.object = "ServiceAccount/" + name
		} else if i := indexFold(msg, "service account "); i >= 0 {
			// Before 1.16: "service account <ns>/<name> was not found".
			if ref := firstWord(msg[i+len("service account "):]); strings.IndexByte(ref, '/') > 0 {
				b.object = "ServiceAccount/" + ref[strings.IndexByte(ref, '/')+1:]
			}
		}
	case eventpipev1.BlockerNamespaceTerminating:
		if i := indexFold(msg, "content in namespace "); i >= 0 {
			if ns := firstWord(msg[i+len("content in namespace "):]); ns != "" {
				b.object = "Namespace/" + ns
			}
		}
	}
	return b
}

// schedulingCause reads the scheduler's summary ("0/N nodes are available:
// 3 Insufficient cpu, 2 node(s) had untolerated taint {...}. preemption:
// ..."; the pre-1.9 "No nodes are available that match all of the
// following predicates:: Insufficient cpu (9), ..."; the 1.4 "fit failure
// on node (n): Insufficient cpu" lines) and names the reason that excludes
// the most nodes (the first of equals), except that a volume node affinity
// conflict always wins. The preemption part says nothing
// about the cause and is dropped from the detail.
func schedulingCause(msg string) (cause, detail string) {
	s := msg
	if i := indexFold(s, "preemption:"); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimRight(strings.TrimSpace(s), ". ")
	detail = blockerDetail(s)
	body := s
	if i := strings.Index(body, ": "); i >= 0 && !strings.HasPrefix(strings.TrimSpace(body[i+2:]), "}") {
		body = body[i+2:]
	}
	cause = summaryCause(body)
	if cause == eventpipev1.BlockerUnknown && len(body) < len(s) {
		// A bare error with no summary header ("PersistentVolumeClaim is
		// not bound: \"x\"" before 1.10): what preceded ": " is the
		// reason.
		cause = summaryCause(s)
	}
	return cause, detail
}

// summaryCause names the summary reason that excludes the most nodes (a
// volume's node affinity always wins).
func summaryCause(body string) string {
	cause, best := eventpipev1.BlockerUnknown, -1
	for body != "" {
		item := body
		if i := strings.IndexAny(body, ",\n"); i >= 0 {
			item, body = body[:i], body[i+1:]
		} else {
			body = ""
		}
		item = strings.TrimSpace(item)
		if hasPrefixFold(item, "fit failure on node") {
			if i := strings.Index(item, "): "); i >= 0 {
				item = item[i+3:]
			}
		}
		c := schedulingItemCause(item)
		if c == "" {
			continue
		}
		if c == eventpipev1.BlockerVolumeNodeAffinity {
			// The volume is pinned to its nodes or zone: the pod can only
			// ever run there, whatever else excludes the other nodes.
			return c
		}
		if n := itemCount(item); n > best {
			cause, best = c, n
		}
	}
	return cause
}

// schedulingItemCause maps one reason of the summary to a cause ("" for
// words that name none, e.g. "that the pod didn't tolerate" after a taint's
// comma). The order matters: a volume's node affinity is not the pod's.
// Reasons are grouped behind one word they share ("volume", "taint",
// "affinity" or "selector"), so an item pays for the patterns of its own
// family only.
func schedulingItemCause(item string) string {
	if containsFold(item, "volume") {
		switch {
		case containsFold(item, "volume node affinity"), containsFold(item, "volume zone"),
			// "didn't match PersistentVolume's node affinity" (1.3x), the
			// NoVolumeZoneConflict and NoVolumeNodeConflict predicates
			// (1.5-1.9).
			containsFold(item, "persistentvolume's node affinity"),
			containsFold(item, "novolumezoneconflict"), containsFold(item, "novolumenodeconflict"):
			return eventpipev1.BlockerVolumeNodeAffinity
		case unusableClaim(item):
			return eventpipev1.BlockerUnboundPVC
		case containsFold(item, "max volume count"), containsFold(item, "volumecount"):
			// NodeVolumeLimits (MaxEBSVolumeCount and the like before 1.9):
			// the nodes' attachable volumes are used up.
			return eventpipev1.BlockerInsufficientResources
		}
	}
	switch {
	case containsFold(item, "insufficient"), containsFold(item, "too many pods"),
		// Kubernetes 1.0's "Failed for reason PodFitsResources and
		// possibly others".
		containsFold(item, "podfitsresources"),
		// The cluster autoscaler cannot add the node: the groups are at
		// their maximum, in back-off after a failed scale-up (a cloud
		// quota, IPs exhausted), or no group's node would fit the pod.
		containsFold(item, "max node group size reached"), containsFold(item, "in backoff after failed scale-up"),
		containsFold(item, "wouldn't fit if a new node is added"),
		// Other capacity a node runs out of: host ports, CSI storage
		// capacity, DRA devices.
		containsFold(item, "free ports"), containsFold(item, "podfitshostports"),
		containsFold(item, "enough free storage"), containsFold(item, "cannot allocate all claims"):
		return eventpipev1.BlockerInsufficientResources
	case containsFold(item, "taint"):
		if containsFold(item, "node.kubernetes.io/") || containsFold(item, "node.cloudprovider.kubernetes.io/uninitialized") {
			// The node lifecycle controller's and kubelet's taints
			// (unreachable, not-ready, unschedulable, memory-, disk- and
			// pid-pressure, network-unavailable, out-of-service) and the
			// cloud provider's uninitialized one mark a node that is down,
			// cordoned or unhealthy: no toleration in the pod would help.
			return eventpipev1.BlockerNodesUnavailable
		}
		return eventpipev1.BlockerUntoleratedTaint
	case containsFold(item, "affinity"), containsFold(item, "selector"):
		if containsFold(item, "node selector") || containsFold(item, "node affinity") ||
			containsFold(item, "matchnodeselector") || containsFold(item, "nodeaffinity") {
			return eventpipev1.BlockerNodeSelectorMismatch
		}
		return eventpipev1.BlockerPodAffinity
	case containsFold(item, "requested node name"), containsFold(item, "requested hostname"), hasPrefixFold(item, "hostname ("):
		// spec.nodeName names a node that cannot take the pod (NodeName;
		// the HostName predicate before 1.19).
		return eventpipev1.BlockerNodeSelectorMismatch
	case containsFold(item, "bound to non-existent"):
		// Per node, a Lost claim: "pvc(s) bound to non-existent pv(s)".
		return eventpipev1.BlockerUnboundPVC
	case containsFold(item, "were unschedulable"), containsFold(item, "not ready"), containsFold(item, "unreachable"),
		containsFold(item, "no nodes available"), // the cluster has no node the scheduler may use
		// Node conditions (1.9-1.1x descriptions, 1.5-1.8 predicate
		// names): pressure, out of disk, network, unknown.
		containsFold(item, "pressure"), containsFold(item, "out of disk"), containsFold(item, "outofdisk"),
		containsFold(item, "notready"), containsFold(item, "unavailable network"), containsFold(item, "networkunavailable"),
		containsFold(item, "unknown condition"):
		return eventpipev1.BlockerNodesUnavailable
	case containsFold(item, "topology spread"):
		// PodTopologySpread: "didn't match pod topology spread constraints",
		// with " (missing required label)" when nodes lack the key.
		return eventpipev1.BlockerTopologySpread
	}
	return ""
}

// unusableClaim: the volume binding plugin's reasons for a claim the pod
// cannot use: unbound ("pod has unbound immediate PersistentVolumeClaims",
// "node(s) didn't find available persistent volumes to bind"), missing
// (`persistentvolumeclaim "x" not found`; before 1.10 "PersistentVolumeClaim
// is not bound: \"x\"" and "PersistentVolume not found: \"y\""; or not created yet for an
// ephemeral volume: "waiting for ephemeral volume controller to create the
// persistentvolumeclaim"), being deleted, or Lost (`persistentvolumeclaim
// "x" bound to non-existent persistentvolume "y"`; per node "pvc(s) bound
// to non-existent pv(s)", checked by the caller), or failed in binding
// ("binding volumes: ..."). Called only for items that say "volume".
func unusableClaim(item string) bool {
	if containsFold(item, "persistentvolumeclaim") {
		return containsFold(item, "unbound") || containsFold(item, "not bound") || containsFold(item, "not found") || containsFold(item, "bound to non-existent") ||
			containsFold(item, "is being deleted") || containsFold(item, "waiting for ephemeral volume controller")
	}
	// "binding volumes: ..." is the VolumeBinding PreBind error: binding or
	// provisioning the pod's claims failed or timed out after a node was
	// chosen.
	return containsFold(item, "persistent volumes to bind") || containsFold(item, "binding volumes") ||
		containsFold(item, "persistentvolume not found")
}

// itemCount is the node count of one summary reason: leading ("3
// Insufficient cpu") or in parentheses ("MatchNodeSelector (18)"); 1 when
// none is given.
func itemCount(item string) int {
	i := 0
	for i < len(item) && item[i] >= '0' && item[i] <= '9' {
		i++
	}
	if i > 0 {
		if n, err := strconv.Atoi(item[:i]); err == nil {
			return n
		}
	}
	if j := strings.LastIndexByte(item, '('); j >= 0 {
		if k := strings.IndexByte(item[j:], ')'); k > 1 {
			if n, err := strconv.Atoi(item[j+1 : j+k]); err == nil {
				return n
			}
		}
	}
	return 1
}

// ClassifyContainerStatus diagnoses a container from its pod status: the
// waiting reason and message, the last termination's reason and exit code.
// ok=false when nothing in it blocks the container.
func ClassifyContainerStatus(waiting, waitingMessage, terminated string, exitCode int32, hasExitCode bool) (cause, detail string, ok bool) {
	b, ok := classifyContainerStatus(waiting, waitingMessage, terminated, exitCode, hasExitCode)
	return b.cause, b.detail, ok
}

func classifyContainerStatus(waiting, waitingMessage, terminated string, exitCode int32, hasExitCode bool) (blockerClass, bool) {
	if len(waitingMessage) > maxClassifyBytes {
		waitingMessage = waitingMessage[:maxClassifyBytes]
	}
	b := blockerClass{kind: eventpipev1.BlockerKindContainer}
	if waiting != "" && waiting != "CrashLoopBackOff" {
		if wb, ok := classifyBlocker(waiting, waitingMessage); ok && wb.kind == eventpipev1.BlockerKindContainer {
			return wb, true
		}
	}
	switch {
	case terminated == "ContainerStatusUnknown" && waiting != "CrashLoopBackOff":
		// kubelet's placeholder (exit code 137) for a container it could
		// not find when the pod was terminated or deleted: no program
		// exited.
		return blockerClass{}, false
	case terminated == "OOMKilled":
		b.cause, b.detail = eventpipev1.BlockerOOMKilled, "OOMKilled"
	case terminated == "ContainerCannotRun" || terminated == "StartError":
		// The runtime could not start the process (Docker's reason, and
		// containerd's, for a missing executable, a bad mount, a failed
		// init): the exit code is the runtime's (-1, 128), not the
		// program's, so this is no exit_error.
		b.cause, b.detail = eventpipev1.BlockerStartFailed, terminated
		if hasExitCode {
			b.detail = terminated + " (exit code " + strconv.Itoa(int(exitCode)) + ")"
		}
	case terminated != "ContainerStatusUnknown" && (hasExitCode && exitCode != 0 || terminated == "Error" && waiting != "CrashLoopBackOff"):
		// A status read without the exit code (a "kubectl get pods"
		// STATUS column: Init:Error, then Init:CrashLoopBackOff) names no
		// code: in back-off that is the crash loop below.
		b.cause, b.detail = eventpipev1.BlockerExitError, terminated
		if hasExitCode {
			b.detail = strings.TrimSpace(terminated + " (exit code " + strconv.Itoa(int(exitCode)) + ")")
		}
	case waiting == "CrashLoopBackOff":
		b = crashLoop(waitingMessage)
		if terminated != "" {
			b.detail = strings.TrimSpace(b.detail + " (last exit: " + terminated + ")")
		}
	default:
		return blockerClass{}, false
	}
	return b, true
}

// blockerDetail is the message without the wrappers controllers and kubelet
// add, cleaned and bounded.
func blockerDetail(msg string) string {
	s := strings.TrimSpace(msg)
	// "Error seen: " is the Agent Sandbox controller's, before the API
	// server's words in its Ready condition.
	for _, p := range [...]string{"(combined from similar events): ", "Error creating: ", "Error seen: ", "Error: "} {
		s = strings.TrimPrefix(s, p)
	}
	out, _ := truncateUTF8(clean(s), 512)
	return out
}

// quotedAfter returns the text between prefix (which ends with a quote)
// and the next quote.
func quotedAfter(s, prefix string) (string, bool) {
	i := indexFold(s, prefix)
	if i < 0 {
		return "", false
	}
	rest := s[i+len(prefix):]
	j := strings.IndexByte(rest, '"')
	if j <= 0 {
		return "", false
	}
	return rest[:j], true
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, " \t\n,;:"); i >= 0 {
		return s[:i]
	}
	return s
}

// containsFold reports whether s contains sub, ASCII case folded; sub is
// lower case. No allocation: blockers are classified on the hot path.
func containsFold(s, sub string) bool { return indexFold(s, sub) >= 0 }

// indexFold finds sub's first byte in either case with strings.IndexByte
// (vectorised), keeping the next position of each case so that neither is
// searched twice, and compares the rest folded only there.
func indexFold(s, sub string) int {
	n := len(sub)
	if n == 0 {
		return 0
	}
	if n > len(s) {
		return -1
	}
	lo := lowerASCII(sub[0])
	up := lo
	if lo >= 'a' && lo <= 'z' {
		up = lo - ('a' - 'A')
	}
	last := len(s) - n // the last start that leaves room for sub
	nextLo, nextUp := -1, -1
	if up == lo {
		nextUp = len(s) // never
	}
	for i := 0; i <= last; {
		if nextLo < i {
			if nextLo = strings.IndexByte(s[i:last+1], lo); nextLo < 0 {
				nextLo = len(s)
			} else {
				nextLo += i
			}
		}
		if nextUp < i {
			if nextUp = strings.IndexByte(s[i:last+1], up); nextUp < 0 {
				nextUp = len(s)
			} else {
				nextUp += i
			}
		}
		j := min(nextLo, nextUp)
		if j > last {
			return -1
		}
		if hasPrefixFold(s[j+1:], sub[1:]) {
			return j
		}
		i = j + 1
	}
	return -1
}

func hasSuffixFold(s, suffix string) bool {
	return len(s) >= len(suffix) && hasPrefixFold(s[len(s)-len(suffix):], suffix)
}

func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		if lowerASCII(s[i]) != lowerASCII(prefix[i]) {
			return false
		}
	}
	return true
}

package gateway

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
	"github.com/eventpipe/eventpipe/sinks/gateway/driverwire"
)

// Platform event source and the names of the keys the proxy writes. The
// first four and the openshell.progress.* keys are the ones the gateway and
// the CLI already read from the driver's own events.
const (
	SourceKubernetes = "kubernetes"

	KeyInvolvedKind   = "involved_kind"
	KeyInvolvedName   = "involved_name"
	KeyNamespace      = "namespace"
	KeyCount          = "count"
	KeyCompleteStep   = "openshell.progress.complete_step"
	KeyCompleteLabel  = "openshell.progress.complete_label"
	KeyActiveStep     = "openshell.progress.active_step"
	KeyActiveDetail   = "openshell.progress.active_detail"
	KeyContainer      = "eventpipe.container"
	KeyImage          = "eventpipe.image"
	KeyImageRole      = "eventpipe.image_role"
	KeyPullCause      = "eventpipe.pull_cause"
	KeyDisposition    = "eventpipe.disposition"
	KeyAttempts       = "eventpipe.attempts"
	KeyBlockerKind    = "eventpipe.blocker_kind"
	KeyBlockerCause   = "eventpipe.blocker_cause"
	KeyBlockerObject  = "eventpipe.blocker_object"
	KeyEventID        = "eventpipe.event_id"
	KeyRole           = "eventpipe.role"
	ConditionImage    = "ImagePulled"
	conditionFalse    = "False"
	readySuffixPrefix = "[eventpipe] "
)

// platformEvent turns one attributed occurrence into the driver platform
// event the gateway relays to `sandbox create` and WatchSandbox clients.
func platformEvent(o *eventpipev1.Occurrence) driverwire.PlatformEvent {
	md := map[string]string{
		KeyInvolvedKind: o.GetInvolvedObject().GetKind(),
		KeyInvolvedName: o.GetInvolvedObject().GetName(),
		KeyNamespace:    o.GetInvolvedObject().GetNamespace(),
		KeyCount:        strconv.Itoa(int(max(o.GetCount(), 1))),
		KeyEventID:      o.GetEventId(),
	}
	if md[KeyNamespace] == "" {
		md[KeyNamespace] = o.GetNamespace()
	}
	set := func(k, v string) {
		if v != "" {
			md[k] = v
		}
	}
	if p := o.GetProgress(); p != nil {
		set(KeyCompleteStep, p.GetCompleteStep())
		set(KeyCompleteLabel, p.GetCompleteLabel())
		set(KeyActiveStep, p.GetActiveStep())
		set(KeyActiveDetail, p.GetActiveDetail())
	}
	set(KeyContainer, o.GetContainer())
	set(KeyImage, o.GetImage())
	set(KeyImageRole, o.GetImageRole())
	set(KeyRole, o.GetRole())
	msg := o.GetMessage()
	// The diagnosis's disposition, attempts and (for an occurrence without
	// a message) its detail: a pull failure's or another blocker's, never
	// both (Occurrence.blocker).
	diagnosis := func(disposition string, attempts uint32, detail string) {
		set(KeyDisposition, disposition)
		if attempts > 0 {
			md[KeyAttempts] = strconv.Itoa(int(attempts))
		}
		if msg == "" {
			msg = detail
		}
	}
	if pf := o.GetPullFailure(); pf != nil {
		set(KeyImage, pf.GetImage())
		set(KeyPullCause, pf.GetCategory())
		diagnosis(pf.GetDisposition(), pf.GetAttempts(), pf.GetDetail())
	}
	// What else blocks the sandbox (unschedulable, a volume, a refused
	// creation, a crashing container): without these keys the gateway has
	// only the writer's words, not the diagnosis.
	if b := o.GetBlocker(); b != nil {
		set(KeyBlockerKind, b.GetKind())
		set(KeyBlockerCause, b.GetCause())
		set(KeyBlockerObject, b.GetObject())
		set(KeyContainer, b.GetContainer())
		diagnosis(b.GetDisposition(), b.GetAttempts(), b.GetDetail())
	}
	t := o.GetOccurredAt()
	if t == nil {
		t = o.GetObservedAt()
	}
	return driverwire.PlatformEvent{
		TimestampMS: t.AsTime().UnixMilli(),
		Source:      SourceKubernetes,
		Type:        o.GetType(),
		Reason:      o.GetReason(),
		Message:     msg,
		Metadata:    md,
	}
}

// The condition of each kind of blocker: its type (status False while the
// blocker is active) and what the message says the subject cannot do. None
// of the types is one the gateway acts on (Ready decides the phase;
// Suspended, ConfigurationReady, DesiredConfigurationReady and
// Bootstrapping have meanings of their own), and none of the reasons is
// ContainerExited or ContainerStopped, which mark any condition as
// "stopped".
const (
	ConditionScheduled  = "PodScheduled"
	ConditionVolumes    = "VolumesReady"
	ConditionCreated    = "PodCreated"
	ConditionContainers = "ContainersRunning"
)

var kindConditions = map[string]struct{ typ, cannot string }{
	diagnosis.KindImagePull:              {ConditionImage, "cannot be pulled"},
	eventpipev1.BlockerKindUnschedulable: {ConditionScheduled, "cannot be scheduled"},
	eventpipev1.BlockerKindVolume:        {ConditionVolumes, "cannot get its volumes"},
	eventpipev1.BlockerKindCreateRefused: {ConditionCreated, "cannot be created"},
	eventpipev1.BlockerKindContainer:     {ConditionContainers, "does not run"},
}

// reasons maps a pull-failure category or a blocker cause to the condition
// reason. None of them is a reason the gateway gives meaning to
// (ContainerExited, ContainerStopped, PodTerminating, PodNotTerminated, or
// the Ready reasons).
var reasons = map[string]string{
	eventpipev1.CategoryNotFound:               "NotFound",
	eventpipev1.CategoryUnauthorized:           "Unauthorized",
	eventpipev1.CategoryNotFoundOrUnauthorized: "NotFoundOrUnauthorized",
	eventpipev1.CategoryRegistryUnreachable:    "RegistryUnreachable",
	eventpipev1.CategoryTLSError:               "TLSError",
	eventpipev1.CategoryRateLimited:            "RateLimited",
	eventpipev1.CategoryInvalidReference:       "InvalidReference",
	eventpipev1.CategoryNeverPull:              "NeverPull",
	eventpipev1.CategoryPlatformMismatch:       "PlatformMismatch",
	eventpipev1.CategoryNodeStorage:            "NodeStorage",
	eventpipev1.CategoryPolicyRejected:         "PolicyRejected",
	eventpipev1.CategoryTimeout:                "Timeout",
	eventpipev1.CategoryKubeletThrottled:       "KubeletThrottled",
	eventpipev1.CategoryRuntimeStore:           "RuntimeStore",
	eventpipev1.CategoryUnsupportedFormat:      "UnsupportedFormat",
	eventpipev1.CategoryUnknown:                "Unknown",
	eventpipev1.CategoryUnrecognised:           "Unrecognised",

	eventpipev1.BlockerInsufficientResources: "InsufficientResources",
	eventpipev1.BlockerUntoleratedTaint:      "UntoleratedTaint",
	eventpipev1.BlockerNodeSelectorMismatch:  "NodeSelectorMismatch",
	eventpipev1.BlockerPodAffinity:           "PodAffinity",
	eventpipev1.BlockerUnboundPVC:            "UnboundPVC",
	eventpipev1.BlockerVolumeNodeAffinity:    "VolumeNodeAffinity",
	eventpipev1.BlockerNodesUnavailable:      "NodesUnavailable",
	eventpipev1.BlockerTopologySpread:        "TopologySpread",
	eventpipev1.BlockerNoStorageClass:        "NoStorageClass",
	eventpipev1.BlockerStorageClassNotFound:  "StorageClassNotFound",
	eventpipev1.BlockerProvisioningFailed:    "ProvisioningFailed",
	eventpipev1.BlockerAttachFailed:          "AttachFailed",
	eventpipev1.BlockerMountTimeout:          "MountTimeout",
	eventpipev1.BlockerMountFailed:           "MountFailed",
	eventpipev1.BlockerSecretNotFound:        "SecretNotFound",
	eventpipev1.BlockerConfigMapNotFound:     "ConfigMapNotFound",
	eventpipev1.BlockerQuotaExceeded:         "QuotaExceeded",
	eventpipev1.BlockerWebhookDenied:         "WebhookDenied",
	eventpipev1.BlockerWebhookFailed:         "WebhookFailed",
	eventpipev1.BlockerPodSecurity:           "PodSecurity",
	eventpipev1.BlockerLimitRange:            "LimitRange",
	eventpipev1.BlockerServiceAccountMissing: "ServiceAccountMissing",
	eventpipev1.BlockerNamespaceTerminating:  "NamespaceTerminating",
	eventpipev1.BlockerCrashLoop:             "CrashLoop",
	eventpipev1.BlockerOOMKilled:             "OOMKilled",
	eventpipev1.BlockerExitError:             "ExitError",
	eventpipev1.BlockerStartFailed:           "StartFailed",
	eventpipev1.BlockerKeyNotFound:           "KeyNotFound",
	eventpipev1.BlockerReadinessProbe:        "ReadinessProbeFailed",
	eventpipev1.BlockerStartupProbe:          "StartupProbeFailed",
	eventpipev1.BlockerLivenessProbe:         "LivenessProbeFailed",
	eventpipev1.BlockerProvisionerWaiting:    "ProvisionerWaiting",
}

// reason is the CamelCase condition reason of a category or cause; one this
// build does not know is converted word by word, prefixed with "Pull" (an
// image) or "Blocked" (any other kind) so it can never spell a reason the
// gateway acts on.
func reason(kind, cause string) string {
	if r, ok := reasons[cause]; ok {
		return r
	}
	prefix := "Blocked"
	if kind == diagnosis.KindImagePull {
		prefix = "Pull"
	}
	var b strings.Builder
	b.WriteString(prefix)
	for _, w := range strings.FieldsFunc(cause, func(r rune) bool { return r == '_' || r == '-' || r == ' ' }) {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	if b.Len() == len(prefix) {
		b.WriteString("Unknown")
	}
	return b.String()
}

// shown reports whether a blocker becomes a condition. Readiness and
// startup probe failures do: the agent's container readiness occurrence
// ends them when the probe passes again. Liveness failures do not: one
// below the failureThreshold restarts nothing, so no Started would end its
// condition, while a liveness probe that keeps failing makes the kubelet
// restart the container into a back-off, which the pod status reports as
// a crash loop with its own condition (the liveness blocker still reaches
// the gateway as a platform event and `eventpipe diagnose`).
func shown(b *diagnosis.Blocker) bool {
	if b.Cause == eventpipev1.BlockerLivenessProbe {
		return false
	}
	_, ok := kindConditions[b.Kind]
	return ok
}

// patchOf is the patch of a sandbox's active blockers (in the folder's
// order: a supervisor image first, then by stage, creation, claims,
// scheduling, volumes, pulls, containers, then oldest first): one
// condition per type, the first blocker of its kind; the Ready=False
// message gets every condition's message appended in that order. nil when
// no blocker is shown.
func patchOf(bs []diagnosis.Blocker) *blockerPatch {
	var bp *blockerPatch
	for i := range bs {
		b := &bs[i]
		if !shown(b) {
			continue
		}
		c := condition(b)
		if bp == nil {
			bp = &blockerPatch{}
		} else if slices.ContainsFunc(bp.p.Add, func(o driverwire.Condition) bool { return o.Type == c.Type }) {
			continue
		}
		bp.p.Add = append(bp.p.Add, c)
		bp.pull = bp.pull || b.Kind == diagnosis.KindImagePull
		if bp.p.ReadySuffix != "" {
			bp.p.ReadySuffix += " "
		}
		bp.p.ReadySuffix += readySuffix(c)
	}
	return bp
}

// condition is the condition of one active blocker: False, the cause as
// reason, and a message naming what is blocked (the image and its role, or
// the pod, claim or Sandbox), the cause and how sure it is, the
// disposition, the attempts, the object the cause names, the container,
// and the runtime's or Kubernetes' own words.
func condition(bl *diagnosis.Blocker) driverwire.Condition {
	kc := kindConditions[bl.Kind]
	var b strings.Builder
	role := bl.Role
	switch {
	case bl.Kind == diagnosis.KindImagePull:
		if bl.ImageRole != "" && bl.ImageRole != eventpipev1.ImageRoleUnknown {
			role = bl.ImageRole
		}
		fmt.Fprintf(&b, "%s image %s", role, bl.Image)
	case bl.Kind == eventpipev1.BlockerKindContainer && bl.Pod != "":
		fmt.Fprintf(&b, "container %s of %s pod %s", bl.Container, role, bl.Pod)
	case bl.Pod != "":
		fmt.Fprintf(&b, "%s pod %s", role, bl.Pod)
	default:
		b.WriteString(bl.Involved)
	}
	cannot := kc.cannot
	if bl.Cause == eventpipev1.BlockerReadinessProbe || bl.Cause == eventpipev1.BlockerStartupProbe {
		cannot = "is not ready" // it may well run
	}
	unrecognised := bl.Cause == eventpipev1.CategoryUnrecognised || bl.Cause == eventpipev1.BlockerUnrecognised
	switch {
	case unrecognised:
		// No cause, so no guess: the runtime's words follow.
		fmt.Fprintf(&b, " %s for a reason eventpipe does not recognise", cannot)
	case bl.Confidence == eventpipev1.ConfidenceLikely:
		fmt.Fprintf(&b, " %s: %s (likely)", cannot, bl.Cause)
	default:
		fmt.Fprintf(&b, " %s: %s", cannot, bl.Cause)
	}
	switch disp := bl.Disposition; disp {
	case "":
	case eventpipev1.DispositionPersistent:
		b.WriteString(" (persistent: retrying will not fix it)")
	default:
		fmt.Fprintf(&b, " (%s)", disp)
	}
	if n := bl.Attempts; n > 0 {
		fmt.Fprintf(&b, ", %d attempts", n)
	}
	if o := bl.Object; o != "" && o != "Pod/"+bl.Pod && o != bl.Involved {
		fmt.Fprintf(&b, ", %s", o)
	}
	if bl.ExitCode != nil {
		fmt.Fprintf(&b, ", exit code %d", *bl.ExitCode)
	}
	if c := bl.Container; c != "" && bl.Kind != eventpipev1.BlockerKindContainer {
		fmt.Fprintf(&b, ", container %s", c)
	}
	if d := bl.Detail; d != "" {
		if bl.Kind == diagnosis.KindImagePull {
			fmt.Fprintf(&b, "; runtime: %s", d)
		} else {
			fmt.Fprintf(&b, "; kubernetes: %s", d)
		}
	}
	return driverwire.Condition{
		Type:               kc.typ,
		Status:             conditionFalse,
		Reason:             reason(bl.Kind, bl.Cause),
		Message:            b.String(),
		LastTransitionTime: bl.Since.UTC().Format(time.RFC3339),
	}
}

// readySuffix is appended to the driver's Ready=False message, so the
// CLI's timeout message names the cause.
func readySuffix(c driverwire.Condition) string {
	return readySuffixPrefix + c.Message
}

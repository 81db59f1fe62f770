package gateway

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
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

// reasons maps a pull-failure category to the condition reason. None of
// them is a reason the gateway gives meaning to (ContainerExited,
// ContainerStopped, PodTerminating, PodNotTerminated, or the Ready reasons).
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
}

// reason is the CamelCase condition reason of a category; a category this
// build does not know is converted word by word, prefixed with "Pull" so it
// can never spell a reason the gateway acts on.
func reason(category string) string {
	if r, ok := reasons[category]; ok {
		return r
	}
	var b strings.Builder
	b.WriteString("Pull")
	for _, w := range strings.FieldsFunc(category, func(r rune) bool { return r == '_' || r == '-' || r == ' ' }) {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	if b.Len() == 4 {
		return "PullUnknown"
	}
	return b.String()
}

// condition is the ImagePulled=False condition for the active failure.
func condition(o *eventpipev1.Occurrence) driverwire.Condition {
	pf := o.GetPullFailure()
	role := o.GetImageRole()
	if role == "" || role == eventpipev1.ImageRoleUnknown {
		role = o.GetRole()
	}
	img := pf.GetImage()
	if img == "" {
		img = o.GetImage()
	}
	disp := pf.GetDisposition()
	if disp == eventpipev1.DispositionPersistent {
		disp = "persistent: retrying will not fix it"
	}
	var b strings.Builder
	switch c := pf.GetCategory(); {
	case c == eventpipev1.CategoryUnrecognised:
		// No category, so no guess: the runtime's words follow.
		fmt.Fprintf(&b, "%s image %s cannot be pulled for a reason eventpipe does not recognise", role, img)
	case pf.GetConfidence() == eventpipev1.ConfidenceLikely:
		fmt.Fprintf(&b, "%s image %s cannot be pulled: %s (likely)", role, img, c)
	default:
		fmt.Fprintf(&b, "%s image %s cannot be pulled: %s", role, img, c)
	}
	if disp != "" {
		fmt.Fprintf(&b, " (%s)", disp)
	}
	if n := pf.GetAttempts(); n > 0 {
		fmt.Fprintf(&b, ", %d attempts", n)
	}
	if c := o.GetContainer(); c != "" {
		fmt.Fprintf(&b, ", container %s", c)
	}
	if d := pf.GetDetail(); d != "" {
		fmt.Fprintf(&b, "; runtime: %s", d)
	}
	since := pf.GetFirstSeen()
	if since == nil {
		since = o.GetOccurredAt()
	}
	return driverwire.Condition{
		Type:               ConditionImage,
		Status:             conditionFalse,
		Reason:             reason(pf.GetCategory()),
		Message:            b.String(),
		LastTransitionTime: since.AsTime().UTC().Format(time.RFC3339),
	}
}

// readySuffix is appended to the driver's Ready=False message, so the
// CLI's timeout message names the cause.
func readySuffix(c driverwire.Condition) string {
	return readySuffixPrefix + c.Message
}

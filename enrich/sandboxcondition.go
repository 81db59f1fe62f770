package enrich

import (
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// The Agent Sandbox controller (v1.0.1) writes no Event when the API
// server refuses the pod or claim it creates for a Sandbox: it puts the
// error in the CR's Ready condition (status False, reason ReconcilerError,
// message "Error seen: " and the API server's words, several errors
// joined by newlines) and retries. ReplicaSets and Jobs say the same in a
// FailedCreate Event, which createRefused reads; the condition is read
// with the same rules.

// readyReconcilerError is the Ready reason of a failed reconcile.
const readyReconcilerError = "ReconcilerError"

// readyCondition returns cr's Ready condition.
func readyCondition(cr *Sandbox) (Condition, bool) {
	if cr == nil {
		return Condition{}, false
	}
	for _, c := range cr.Conditions {
		if c.Type == "Ready" {
			return c, true
		}
	}
	return Condition{}, false
}

// SandboxRefusal reports whether cr's Ready condition says the API server
// refused something the controller creates, and returns the condition. A
// ReconcilerError whose words name no refusal (a conflict on update, a
// timeout) is none: the controller's next try can succeed by itself. Cheap
// for every other condition (a reason compare), so informer handlers may
// call it.
func SandboxRefusal(cr *Sandbox) (Condition, bool) {
	c, ok := readyCondition(cr)
	if !ok || c.Status != "False" || c.Reason != readyReconcilerError {
		return c, false
	}
	_, ok = conditionRefusal(c.Message)
	return c, ok
}

// SandboxRefusalChanged reports whether a Sandbox CR's update changes what
// its Ready condition says about a refusal (one begins, ends, or says
// other words): the cases DiagnoseSandbox writes an occurrence for.
func SandboxRefusalChanged(old, cur *Sandbox) bool {
	oc, was := SandboxRefusal(old)
	nc, is := SandboxRefusal(cur)
	return was != is || is && oc.Message != nc.Message
}

// conditionRefusal classifies a ReconcilerError message as a refused
// creation: a family of createFamilies names the cause, or the API server's
// Forbidden wording ("pods \"x\" is forbidden: ...") or a webhook's denial
// says it refused without a rule naming why (cause unknown).
func conditionRefusal(msg string) (blockerClass, bool) {
	if len(msg) > maxClassifyBytes {
		msg = msg[:maxClassifyBytes]
	}
	b := createRefused(msg)
	if b.cause == eventpipev1.BlockerUnknown && !containsFold(msg, " is forbidden: ") && !containsFold(msg, "denied the request") {
		return blockerClass{}, false
	}
	return b, true
}

// DiagnoseSandbox is the sandbox condition occurrence of cr (see
// eventpipev1.SandboxConditionEventIDPrefix): when its Ready condition
// says the API server refused the pod, one with a create_refused blocker
// (source sandbox_condition) about the CR, the condition's reason and
// message; otherwise one without a blocker carrying the Ready condition as
// it now is, which tells readers the refusal ended. The caller writes it
// when SandboxRefusalChanged (or, for a CR first seen, SandboxRefusal)
// says so. event_id "sandbox-condition/<CR uid>/<resourceVersion>": the
// same CR version seen twice is the same occurrence. nil for a CR without
// a sandbox id (not OpenShell's).
func (e *Enricher) DiagnoseSandbox(cr *Sandbox, observedAt time.Time) *eventpipev1.Occurrence {
	if cr == nil || firstKey(cr.Annotations, e.rules.SandboxIDKeys) == "" && firstKey(cr.Labels, e.rules.SandboxIDKeys) == "" {
		return nil
	}
	cond, haveReady := readyCondition(cr)
	refused, isRefusal := blockerClass{}, false
	if cond.Status == "False" && cond.Reason == readyReconcilerError {
		refused, isRefusal = conditionRefusal(cond.Message)
	}
	ev := &Event{
		APIVersion:      cr.APIVersion,
		Namespace:       cr.Namespace,
		Name:            cr.Name,
		UID:             cr.UID,
		ResourceVersion: cr.ResourceVersion,
		Involved: ObjectRef{
			Kind: e.rules.SandboxKind, APIVersion: cr.APIVersion, Namespace: cr.Namespace, Name: cr.Name, UID: cr.UID,
		},
		Type:               "Normal",
		Reason:             cond.Reason,
		Message:            cond.Message,
		Count:              1,
		ReportingComponent: eventpipev1.ComponentAgent,
	}
	switch {
	case isRefusal:
		ev.Type = "Warning"
	case !haveReady:
		ev.Reason, ev.Message = eventpipev1.ReasonSandboxConditionCleared, "the Sandbox has no Ready condition"
	}
	at := observedAt
	if !validTime(at) {
		at = time.Now()
	}
	o := e.enrich(ev, at, eventpipev1.PullSourceSandboxCondition, false)
	f := [...]string{cr.UID, cr.ResourceVersion, cr.Namespace, cr.Name}
	cleanFields(f[:])
	if f[0] != "" {
		o.EventId = eventpipev1.SandboxConditionEventIDPrefix + f[0] + "/" + f[1]
	} else {
		o.EventId = eventpipev1.SandboxConditionEventIDPrefix + "nouid/" + f[2] + "/" + f[3] + "/" + f[1]
	}
	if isRefusal {
		o.Blocker = e.recordBlocker(ev, nil, "", refused, blockerSignal{
			class: refused, at: at, first: at, count: 1, source: eventpipev1.PullSourceSandboxCondition,
		}, 0)
	}
	return o
}

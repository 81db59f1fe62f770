package enrich

import (
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// The Ready condition messages below are the Agent Sandbox controller's
// (v1.0.1, "Error seen: " and the error of its Create) around the API
// server's words, as make run's quota and webhook scenarios read them
// back; a joined error (claim and pod both refused) is newline-separated.
const (
	condQuota    = `Error seen: pods "quota" is forbidden: exceeded quota: sandbox-pods, requested: pods=1, used: pods=0, limited: pods=0`
	condWebhook  = `Error seen: admission webhook "sandbox-policy.eventpipe.test" denied the request: sandbox images must come from registry.eventpipe.test (policy sandbox-images)`
	condJoined   = "Error seen: persistentvolumeclaims \"workspace-quota\" is forbidden: exceeded quota: claims, requested: persistentvolumeclaims=1, used: persistentvolumeclaims=0, limited: persistentvolumeclaims=0\npods \"quota\" is forbidden: exceeded quota: sandbox-pods, requested: pods=1, used: pods=0, limited: pods=0"
	condPSA      = `Error seen: pods "quota" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false`
	condOther    = `Error seen: pods "quota" is forbidden: something no rule reads`
	condConflict = `Error seen: Operation cannot be fulfilled on sandboxes.agents.x-k8s.io "quota": the object has been modified; please apply your changes to the latest version and try again`
)

func readyCR(status, reason, msg string) *Sandbox {
	cr := seedCR(true)
	cr.ResourceVersion = "7001"
	if reason != "" {
		cr.Conditions = []Condition{{Type: "Ready", Status: status, Reason: reason, Message: msg}}
	}
	return cr
}

// A refusal in the Sandbox's Ready condition (no Event says it) is a
// create_refused blocker about the CR, with the cause the API server's
// words name; a ReconcilerError that names no refusal, and every other
// condition, is none.
func TestDiagnoseSandboxRefusal(t *testing.T) {
	for _, tc := range []struct {
		name, status, reason, msg string
		cause, object             string // "" cause: no blocker
		fix                       string
	}{
		{"quota", "False", "ReconcilerError", condQuota, eventpipev1.BlockerQuotaExceeded, "ResourceQuota/sandbox-pods", "quota (ResourceQuota/sandbox-pods) refuses the pod"},
		{"webhook", "False", "ReconcilerError", condWebhook, eventpipev1.BlockerWebhookDenied, "AdmissionWebhook/sandbox-policy.eventpipe.test", "the admission webhook sandbox-policy.eventpipe.test denies the pod (admission webhook"},
		{"claim and pod refused", "False", "ReconcilerError", condJoined, eventpipev1.BlockerQuotaExceeded, "ResourceQuota/claims", "raise the quota"},
		{"pod security", "False", "ReconcilerError", condPSA, eventpipev1.BlockerPodSecurity, "", ""},
		{"forbidden, no rule", "False", "ReconcilerError", condOther, eventpipev1.BlockerUnknown, "Sandbox/img-missing", "read the message of the Sandbox's Ready condition"},
		{"conflict is no refusal", "False", "ReconcilerError", condConflict, "", "", ""},
		{"pending pod", "False", "DependenciesNotReady", "Pod exists with phase: Pending", "", "", ""},
		{"ready", "True", "DependenciesReady", "Pod is Ready", "", "", ""},
		{"no condition", "", "", "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
			cr := readyCR(tc.status, tc.reason, tc.msg)
			if _, refused := SandboxRefusal(cr); refused != (tc.cause != "") {
				t.Errorf("SandboxRefusal = %v, want %v", refused, tc.cause != "")
			}
			o := e.DiagnoseSandbox(cr, t0)
			if o == nil {
				t.Fatal("no occurrence")
			}
			if o.GetEventId() != "sandbox-condition/"+seedCRUID+"/7001" || !eventpipev1.IsSandboxCondition(o) {
				t.Errorf("event_id %q, component %q", o.GetEventId(), o.GetReportingComponent())
			}
			if o.GetSandbox().GetId() != seedID || o.GetInvolvedObject().GetKind() != "Sandbox" || o.GetInvolvedObject().GetName() != "img-missing" {
				t.Errorf("sandbox %v, involved %v", o.GetSandbox(), o.GetInvolvedObject())
			}
			b := o.GetBlocker()
			if tc.cause == "" {
				if b != nil {
					t.Fatalf("blocker %v, want none", b)
				}
				if o.GetType() != "Normal" {
					t.Errorf("type %s", o.GetType())
				}
				if tc.reason == "" && o.GetReason() != eventpipev1.ReasonSandboxConditionCleared {
					t.Errorf("reason %q without a Ready condition", o.GetReason())
				}
				return
			}
			if b == nil {
				t.Fatal("no blocker")
			}
			if b.GetKind() != eventpipev1.BlockerKindCreateRefused || b.GetCause() != tc.cause || b.GetSource() != eventpipev1.PullSourceSandboxCondition {
				t.Errorf("blocker %s/%s from %s, want create_refused/%s from sandbox_condition", b.GetKind(), b.GetCause(), b.GetSource(), tc.cause)
			}
			if tc.object != "" && b.GetObject() != tc.object {
				t.Errorf("object %q, want %q", b.GetObject(), tc.object)
			}
			if strings.HasPrefix(b.GetDetail(), "Error seen: ") || !strings.Contains(tc.msg, b.GetDetail()[:20]) {
				t.Errorf("detail %q: the API server's words, without the controller's prefix", b.GetDetail())
			}
			if !strings.Contains(b.GetFix(), tc.fix) {
				t.Errorf("fix %q lacks %q", b.GetFix(), tc.fix)
			}
			if o.GetType() != "Warning" || o.GetReason() != "ReconcilerError" || o.GetMessage() != tc.msg {
				t.Errorf("occurrence %s %s %q: the condition as the controller wrote it", o.GetType(), o.GetReason(), o.GetMessage())
			}
		})
	}
}

// SandboxRefusalChanged: the cases the agent writes an occurrence for.
func TestSandboxRefusalChanged(t *testing.T) {
	quota := readyCR("False", "ReconcilerError", condQuota)
	webhook := readyCR("False", "ReconcilerError", condWebhook)
	pending := readyCR("False", "DependenciesNotReady", "Pod exists with phase: Pending")
	ready := readyCR("True", "DependenciesReady", "Pod is Ready")
	conflict := readyCR("False", "ReconcilerError", condConflict)
	for _, tc := range []struct {
		name     string
		old, cur *Sandbox
		want     bool
	}{
		{"refusal begins", pending, quota, true},
		{"refusal ends", quota, pending, true},
		{"other words", quota, webhook, true},
		{"same refusal", quota, readyCR("False", "ReconcilerError", condQuota), false},
		{"no refusal either side", pending, ready, false},
		{"conflict after a refusal ends it", quota, conflict, true},
		{"conflict alone", pending, conflict, false},
		{"first seen", nil, quota, true},
	} {
		if got := SandboxRefusalChanged(tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A sandbox without an OpenShell id is none of eventpipe's business.
func TestDiagnoseSandboxNotOpenShell(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	cr := readyCR("False", "ReconcilerError", condQuota)
	cr.Labels, cr.Annotations = nil, nil
	if o := e.DiagnoseSandbox(cr, t0); o != nil {
		t.Errorf("occurrence %v for a CR without a sandbox id", o)
	}
}

package enrich

import (
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestBlockerConfidence: a blocker's cause says how sure it is: certain
// when a rule or a status field names it, likely when only the reason
// does, weak for unknown; a refused creation whose words name two
// families is unrecognised, with the words and no fix.
func TestBlockerConfidence(t *testing.T) {
	tests := []struct {
		name, reason, msg string
		cause, confidence string
	}{
		{"the scheduler's summary", "FailedScheduling", "0/3 nodes are available: 3 Insufficient cpu.",
			eventpipev1.BlockerInsufficientResources, eventpipev1.ConfidenceCertain},
		{"a summary no rule reads", "FailedScheduling", "0/3 nodes are available: 3 node(s) were out of luck.",
			eventpipev1.BlockerUnknown, eventpipev1.ConfidenceWeak},
		{"a quota", "FailedCreate", `Error creating: pods "sbx-0" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=8, limited: cpu=8`,
			eventpipev1.BlockerQuotaExceeded, eventpipev1.ConfidenceCertain},
		{"a webhook that quotes a quota decides", "FailedCreate",
			`Error creating: admission webhook "policy.example.com" denied the request: pods over the exceeded quota: compute are not allowed`,
			eventpipev1.BlockerWebhookDenied, eventpipev1.ConfidenceCertain},
		{"two families disagree", "FailedCreate",
			`Error creating: pods "sbx-0" is forbidden: exceeded quota: compute, and unable to create new content in namespace sbx because it is being terminated`,
			eventpipev1.BlockerUnrecognised, eventpipev1.ConfidenceWeak},
		{"a refusal no rule reads", "FailedCreate", `Error creating: pods "sbx-0" is forbidden: the moon is in the wrong phase`,
			eventpipev1.BlockerUnknown, eventpipev1.ConfidenceWeak},
		{"a start failure read from its words", "Failed", `Error: failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "/agent": stat /agent: no such file or directory: unknown`,
			eventpipev1.BlockerStartFailed, eventpipev1.ConfidenceCertain},
		{"a start failure only the reason names", "RunContainerError", "the runtime said something new",
			eventpipev1.BlockerStartFailed, eventpipev1.ConfidenceLikely},
	}
	for _, tt := range tests {
		b, ok := classifyBlocker(tt.reason, tt.msg)
		if !ok || b.cause != tt.cause || b.strength.String() != tt.confidence {
			t.Errorf("%s: got %s %s (ok=%v), want %s %s", tt.name, b.cause, b.strength, ok, tt.cause, tt.confidence)
		}
	}
}

// TestEnrichCarriesDecision: the occurrence's pull failure and blocker say
// text_rule and the confidence; an unrecognised blocker has no fix and
// keeps the words; a back-off with no cause keeps the inherited cause's
// confidence.
func TestEnrichCarriesDecision(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	o := e.Enrich(podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed), t0).Occurrence
	if pf := o.GetPullFailure(); pf.GetDecidedBy() != eventpipev1.DecidedByTextRule || pf.GetConfidence() != eventpipev1.ConfidenceCertain {
		t.Fatalf("pull failure decided_by %q confidence %q", pf.GetDecidedBy(), pf.GetConfidence())
	}
	bo := podEvent("img-missing", "spec.initContainers{workspace-init}", "BackOff", `Back-off pulling image "docker.io/library/busybox:0.0.0-does-not-exist"`)
	o = e.Enrich(bo, t0).Occurrence
	if pf := o.GetPullFailure(); pf.GetCategory() != eventpipev1.CategoryNotFound || pf.GetConfidence() != eventpipev1.ConfidenceCertain {
		t.Errorf("back-off: %s %s, want the inherited not_found certain", pf.GetCategory(), pf.GetConfidence())
	}
	o = e.Enrich(podEvent("img-missing", "spec.containers{agent}", "Failed",
		`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = the flux capacitor is misaligned`), t0).Occurrence
	if pf := o.GetPullFailure(); pf.GetCategory() != eventpipev1.CategoryUnrecognised || pf.GetConfidence() != eventpipev1.ConfidenceWeak ||
		pf.GetDetail() != "the flux capacitor is misaligned" {
		t.Errorf("unrecognised pull: %+v", pf)
	}
	msg := `Error creating: pods "sbx-0" is forbidden: exceeded quota: compute, and unable to create new content in namespace sbx because it is being terminated`
	ev := podEvent("img-missing", "", "FailedCreate", msg)
	ev.Involved.Kind, ev.Involved.Name = "ReplicaSet", "sbx"
	b := e.Enrich(ev, t0).Occurrence.GetBlocker()
	if b.GetCause() != eventpipev1.BlockerUnrecognised || b.GetFix() != "" || b.GetDetail() == "" ||
		b.GetDecidedBy() != eventpipev1.DecidedByTextRule || b.GetConfidence() != eventpipev1.ConfidenceWeak {
		t.Errorf("unrecognised blocker: %+v", b)
	}
}

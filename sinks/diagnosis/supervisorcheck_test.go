package diagnosis

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func supervisorCheck(at time.Time, image string, pf *eventpipev1.PullFailure) *eventpipev1.Occurrence {
	reason := eventpipev1.ReasonSupervisorImageVerified
	if pf != nil {
		reason = eventpipev1.ReasonSupervisorImageUnavailable
	}
	return &eventpipev1.Occurrence{
		EventId: eventpipev1.SupervisorCheckEventIDPrefix + "openshell/openshell/" + at.Format(time.RFC3339Nano), OccurredAt: timestamppb.New(at),
		ReportingComponent: eventpipev1.ComponentAgent, Reason: reason, Image: image, ImageRole: eventpipev1.ImageRoleSupervisor,
		Sandbox:        &eventpipev1.Sandbox{GatewayId: "openshell"},
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "StatefulSet", Namespace: "openshell", Name: "openshell"},
		Message:        "supervisor image " + image + ": fine", PullFailure: pf,
	}
}

// TestSupervisorCheckBeforeAnySandbox: the agent's check alone makes a
// supervisor failure that blocks no sandbox yet; a later check that
// says the image is fine clears it; a check confirming sandboxes'
// failures marks their group verified.
func TestSupervisorCheckBeforeAnySandbox(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	bad := "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"
	pf := &eventpipev1.PullFailure{Category: eventpipev1.CategoryNotFound, Image: bad, DecidedBy: eventpipev1.DecidedByRegistry,
		Confidence: eventpipev1.ConfidenceCertain, Detail: "tag 0.0.0-does-not-exist does not exist in ghcr.io/nvidia/openshell/supervisor; newest tags by version (of 3): 0.0.36, 0.0.35, 0.0.34"}
	f := NewFolder()
	if !f.Add(1, supervisorCheck(t0, bad, pf)) {
		t.Fatal("a supervisor check changed nothing")
	}
	if f.Len() != 0 {
		t.Fatalf("the check made %d sandboxes", f.Len())
	}
	gs := WithChecks(Supervisor(f.Sandboxes()), f.SupervisorChecks())
	if len(gs) != 1 || gs[0].Image != bad || gs[0].Cause != eventpipev1.CategoryNotFound || len(gs[0].Sandboxes) != 0 || gs[0].Verified == nil {
		t.Fatalf("groups %+v", gs)
	}
	var out bytes.Buffer
	if err := WriteSupervisor(&out, gs, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"supervisor image " + bad + " of gateway openshell: not_found", "blocks no sandbox yet",
		"registry (verified 1m00s ago, set on StatefulSet openshell/openshell): tag 0.0.0-does-not-exist does not exist", "newest tags by version (of 3): 0.0.36",
		"fix: tag 0.0.0-does-not-exist does not exist in ghcr.io/nvidia/openshell/supervisor"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
	// An older check read later changes nothing; a newer good one clears.
	if f.Add(2, supervisorCheck(t0.Add(-time.Hour), bad, nil)) {
		t.Error("an older check replaced a newer one")
	}
	f.Add(3, supervisorCheck(t0.Add(time.Hour), "ghcr.io/nvidia/openshell/supervisor:0.0.36", nil))
	if gs := WithChecks(Supervisor(f.Sandboxes()), f.SupervisorChecks()); len(gs) != 0 {
		t.Errorf("after a good check: %+v", gs)
	}
	// Other unattributed occurrences are still not folded.
	if f.Add(4, &eventpipev1.Occurrence{EventId: "x/1", Sandbox: &eventpipev1.Sandbox{GatewayId: "openshell"}, PullFailure: pf}) {
		t.Error("an unattributed occurrence changed the diagnosis")
	}
}

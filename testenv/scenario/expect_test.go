package scenario_test

import (
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
	"github.com/eventpipe/eventpipe/testenv/scenario"
	"k8s.io/apimachinery/pkg/types"
)

// The expectations the scenarios hand to the agent's tests agree with the
// project's own pull classifier and naming rules, so a test failure points
// at the agent, not at the driver.
func TestExpectationsAgreeWithClassifier(t *testing.T) {
	for _, name := range scenario.Names() {
		for _, mode := range scenario.Modes {
			for _, gen := range []scenario.Generation{scenario.Newer, scenario.Older} {
				sc, err := scenario.Build(name, scenario.Params{Mode: mode, Generation: gen})
				if err != nil {
					t.Fatalf("%s/%s: %v", name, mode, err)
				}
				if sc.EventCount() == 0 {
					t.Errorf("%s/%s: no events", name, mode)
				}
				for _, e := range sc.Events() {
					checkExpectation(t, name+"/"+string(mode), e)
				}
			}
		}
	}
}

func checkExpectation(t *testing.T, where string, e scenario.EventInfo) {
	t.Helper()
	x := e.Expect
	where += " " + e.Reason + " " + e.Container
	if x.SandboxID != e.Sandbox.ID || x.Workspace != e.Sandbox.Workspace || x.SandboxName != e.Sandbox.Name {
		t.Errorf("%s: expectation names sandbox %s/%s/%s, event is about %s", where, x.SandboxID, x.Workspace, x.SandboxName, e.Sandbox.ID)
	}
	category, image, _, ok := enrich.ClassifyPull(e.Reason, e.Message)
	switch {
	case !x.PullFailure && ok:
		t.Errorf("%s: classifier sees a pull failure (%s) in %q, expectation does not", where, category, e.Message)
	case x.PullFailure && !ok:
		t.Errorf("%s: expectation is a pull failure, classifier disagrees on %q", where, e.Message)
	case x.PullFailure && x.CategoryInMessage && category != x.PullCategory:
		t.Errorf("%s: category %s, classifier says %s for %q", where, x.PullCategory, category, e.Message)
	case x.PullFailure && !x.CategoryInMessage && category != eventpipev1.CategoryUnknown:
		t.Errorf("%s: message %q names category %s but CategoryInMessage is false", where, e.Message, category)
	}
	checkBlockerExpectation(t, where, e)
	if ok && image != "" && x.Image != "" && image != x.Image {
		t.Errorf("%s: image %q, classifier reads %q", where, x.Image, image)
	}
	if x.Image != "" && !strings.Contains(e.Message, x.Image) {
		t.Errorf("%s: expected image %q not in message %q", where, x.Image, e.Message)
	}
	wantRole := map[scenario.Target]string{
		scenario.TargetWorkloadPod: eventpipev1.RoleWorkload, scenario.TargetSupervisorPod: eventpipev1.RoleSupervisor,
		scenario.TargetSandbox: eventpipev1.RoleSandbox, scenario.TargetPVC: eventpipev1.RoleVolume,
	}[e.Target]
	if x.Role != wantRole {
		t.Errorf("%s: role %q, want %q", where, x.Role, wantRole)
	}
	if (x.Container == "") != (x.ImageRole == "") || x.ImageRole == eventpipev1.ImageRoleUnknown {
		t.Errorf("%s: container %q with image role %q", where, x.Container, x.ImageRole)
	}
	if x.Container != "" && e.Component != scenario.KubeletComponent {
		t.Errorf("%s: only kubelet events name a container", where)
	}
}

func TestNamingRules(t *testing.T) {
	id := "2FF21E26-1A7B-49A2-A640-14AE153F93EA"
	tests := []struct {
		mode                      scenario.Mode
		ns, cr, pod, sup, pvcName string
	}{
		{scenario.ModeManaged, "openshell-openshell-repro", "img-missing", "img-missing", "os-supervisor-2ff21e26-1a7b-49a2-a640-14ae153f93ea", "workspace-img-missing"},
		{scenario.ModeOperator, "repro", "img-missing", "img-missing", "os-supervisor-2ff21e26-1a7b-49a2-a640-14ae153f93ea", "workspace-img-missing"},
		{scenario.ModeShared, "openshell", "repro--img-missing", "repro--img-missing", "os-supervisor-2ff21e26-1a7b-49a2-a640-14ae153f93ea", "workspace-repro--img-missing"},
	}
	for _, tt := range tests {
		sb := scenario.NewSandbox("img-missing", "repro", tt.mode)
		sb.ID = id
		if sb.Namespace() != tt.ns || sb.CRName() != tt.cr || sb.PodName() != tt.pod || sb.SupervisorPodName() != tt.sup || sb.PVCName() != tt.pvcName {
			t.Errorf("%s: got %s %s %s %s %s", tt.mode, sb.Namespace(), sb.CRName(), sb.PodName(), sb.SupervisorPodName(), sb.PVCName())
		}
	}
	if _, err := scenario.ParseMode("bogus"); err == nil {
		t.Error("ParseMode(bogus): no error")
	}
	if _, err := scenario.Build("bogus", scenario.Params{}); err == nil {
		t.Error("Build(bogus): no error")
	}
	u := scenario.NewUUID()
	if len(u) != 36 || u[14] != '4' {
		t.Errorf("NewUUID() = %q, not a UUIDv4", u)
	}
}

func typesUID(s string) types.UID { return types.UID(s) }

// checkBlockerExpectation: the blocker an expectation names is the one the
// project's classifier reads in the message, and events that name none are
// no blocker to it.
func checkBlockerExpectation(t *testing.T, where string, e scenario.EventInfo) {
	t.Helper()
	x := e.Expect
	kind, cause, _, _, ok := enrich.ClassifyBlocker(e.Reason, e.Message)
	if _, _, _, pull := enrich.ClassifyPull(e.Reason, e.Message); pull {
		ok = false // the enricher diagnoses a pull, never a blocker too
	}
	switch {
	case x.BlockerKind == "" && ok:
		t.Errorf("%s: classifier sees a blocker (%s/%s) in %q, expectation does not", where, kind, cause, e.Message)
	case x.BlockerKind != "" && !ok:
		t.Errorf("%s: expectation is a %s blocker, classifier disagrees on %q", where, x.BlockerKind, e.Message)
	case x.BlockerKind != "" && kind != x.BlockerKind:
		t.Errorf("%s: blocker kind %s, classifier says %s", where, x.BlockerKind, kind)
	case x.CauseInMessage && cause != x.BlockerCause:
		t.Errorf("%s: blocker cause %s, classifier says %s for %q", where, x.BlockerCause, cause, e.Message)
	}
}

package collector

import (
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestSelectorSupervisorCheck: the agent's supervisor-image check belongs
// to no sandbox; a gateway selection carries it to a reader granted any
// workspace, and nothing else does. Other unattributed occurrences stay out.
func TestSelectorSupervisorCheck(t *testing.T) {
	check := &eventpipev1.Occurrence{EventId: eventpipev1.SupervisorCheckEventIDPrefix + "openshell/openshell/1",
		ReportingComponent: eventpipev1.ComponentAgent, Reason: eventpipev1.ReasonSupervisorImageUnavailable,
		Sandbox: &eventpipev1.Sandbox{GatewayId: "gw-a"}}
	forged := &eventpipev1.Occurrence{EventId: "uid/1", ReportingComponent: eventpipev1.ComponentAgent,
		Reason: eventpipev1.ReasonSupervisorImageUnavailable, Sandbox: &eventpipev1.Sandbox{GatewayId: "gw-a"}}
	ws1 := &Principal{Workspaces: []string{"ws1"}}
	none := &Principal{}
	cases := []struct {
		name string
		sel  selector
		p    *Principal
		o    *eventpipev1.Occurrence
		want bool
	}{
		{"gateway selection, reader of one workspace", selector{gatewayID: "gw-a"}, ws1, check, true},
		{"another gateway", selector{gatewayID: "gw-b"}, ws1, check, false},
		{"a principal with no read grant", selector{gatewayID: "gw-a"}, none, check, false},
		{"a workspace selection", selector{workspace: "ws1"}, ws1, check, false},
		{"unattributed, not the check", selector{gatewayID: "gw-a"}, ws1, forged, false},
	}
	for _, c := range cases {
		if got := c.sel.match(c.p, c.o); got != c.want {
			t.Errorf("%s: match = %v, want %v", c.name, got, c.want)
		}
	}
}

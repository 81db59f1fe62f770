package diagnosis

import (
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/remedy"
)

// SupervisorCheck is the agent's latest registry answer about a gateway's
// supervisor image (verify.supervisor; eventpipev1.IsSupervisorCheck):
// known before any sandbox pulled it.
type SupervisorCheck struct {
	GatewayID string `json:"gateway_id"`
	Image     string `json:"image"`
	// OK: the registry serves the image; otherwise Cause says why not.
	OK         bool      `json:"ok"`
	Cause      string    `json:"cause,omitempty"`
	Confidence string    `json:"confidence,omitempty"`
	Detail     string    `json:"detail"`
	Remedy     string    `json:"remedy,omitempty"`
	Workload   string    `json:"workload"`
	CheckedAt  time.Time `json:"checked_at"`
}

// addCheck keeps the newest supervisor check per gateway; true when it
// replaced what a reader is shown.
func (f *Folder) addCheck(o *eventpipev1.Occurrence) bool {
	at := o.GetOccurredAt().AsTime()
	gw := o.GetSandbox().GetGatewayId()
	if prev, ok := f.checks[gw]; ok && !at.After(prev.CheckedAt) {
		return false
	}
	pf := o.GetPullFailure()
	c := SupervisorCheck{GatewayID: gw, Image: o.GetImage(), OK: pf == nil, Detail: o.GetMessage(), CheckedAt: at,
		Workload: o.GetInvolvedObject().GetKind() + " " + o.GetInvolvedObject().GetNamespace() + "/" + o.GetInvolvedObject().GetName()}
	if pf != nil {
		c.Cause, c.Confidence, c.Detail = pf.GetCategory(), pf.GetConfidence(), pf.GetDetail()
		c.Remedy = remedy.Pull(remedy.Input{Category: pf.GetCategory(), Image: o.GetImage(), ImageRole: eventpipev1.ImageRoleSupervisor, Detail: pf.GetDetail()})
	}
	if f.checks == nil {
		f.checks = map[string]SupervisorCheck{}
	}
	f.checks[gw] = c
	return true
}

// SupervisorChecks returns the newest supervisor check of every gateway seen.
func (f *Folder) SupervisorChecks() []SupervisorCheck {
	out := make([]SupervisorCheck, 0, len(f.checks))
	for _, c := range f.checks {
		out = append(out, c)
	}
	return out
}

// WithChecks adds to the supervisor-image failures of sandboxes (Supervisor)
// what the agent's registry checks say: a failure the registry confirmed
// is marked verified, and a bad supervisor image no sandbox has tried yet
// becomes a failure that blocks no sandbox yet.
func WithChecks(gs []SupervisorFailure, checks []SupervisorCheck) []SupervisorFailure {
	for _, c := range checks {
		if c.OK {
			continue
		}
		found := false
		for i := range gs {
			if gs[i].GatewayID == c.GatewayID && gs[i].Image == c.Image {
				gs[i].Verified = &c
				found = true
			}
		}
		if !found {
			gs = append(gs, SupervisorFailure{GatewayID: c.GatewayID, Image: c.Image, Cause: c.Cause,
				Disposition: eventpipev1.DispositionPersistent, Since: c.CheckedAt, LastSeen: c.CheckedAt,
				Detail: c.Detail, Remedy: c.Remedy, Sandboxes: []SandboxRef{}, Verified: &c})
		}
	}
	return gs
}

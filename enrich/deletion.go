package enrich

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// SandboxDeleted is the deletion occurrence of a Sandbox CR the caller saw
// deleted at (its watch said so, or a relisting no longer had it): no
// Kubernetes Event says that a sandbox is gone, yet every reader needs to
// know, because OpenShell may create a new sandbox (a new id) under the same
// name while Events of the old one's pods still arrive. The occurrence is
// attributed by the CR's own id keys (as an Event about the CR would be),
// carries sandbox.deleted_at, involved_object the CR, reason
// eventpipev1.ReasonSandboxDeleted, reporting_component
// eventpipev1.ComponentAgent and event_id "sandbox-deleted/<CR uid>", so
// seeing the same deletion twice (a relisting after a restart) is the same
// occurrence. It returns nil for a CR without a sandbox id (not OpenShell's:
// nothing to tell).
func (e *Enricher) SandboxDeleted(cr *Sandbox, at time.Time) *eventpipev1.Occurrence {
	if cr == nil {
		return nil
	}
	rule := eventpipev1.AttributionSandboxAnnotation
	if firstKey(cr.Annotations, e.rules.SandboxIDKeys) == "" {
		if firstKey(cr.Labels, e.rules.SandboxIDKeys) == "" {
			return nil
		}
		rule = eventpipev1.AttributionSandboxLabel
	}
	cp := *cr
	if cp.DeletedAt.IsZero() {
		cp.DeletedAt = at
	}
	sb, _ := e.describe(&eventpipev1.Sandbox{}, &cp, nil, cr.Namespace, "")
	f := [...]string{cr.UID, cr.Namespace, cr.Name, cr.APIVersion, cr.ResourceVersion}
	cleanFields(f[:])
	uid, ns, name, api, rv := f[0], f[1], f[2], f[3], f[4]
	id := eventpipev1.DeletionEventIDPrefix + uid
	if uid == "" {
		id = eventpipev1.DeletionEventIDPrefix + "nouid/" + ns + "/" + name + "/" + rv
	}
	ts := timestamppb.New(at)
	return &eventpipev1.Occurrence{
		SchemaVersion:      eventpipev1.SchemaVersion,
		EventId:            id,
		OccurredAt:         ts,
		ObservedAt:         timestamppb.New(at),
		Cluster:            e.cluster,
		Namespace:          ns,
		InvolvedObject:     &eventpipev1.ObjectRef{Kind: e.rules.SandboxKind, ApiVersion: api, Namespace: ns, Name: name, Uid: uid},
		Type:               "Normal",
		Reason:             eventpipev1.ReasonSandboxDeleted,
		Message:            clean("Sandbox " + ns + "/" + name + " (id " + sb.GetId() + ") was deleted"),
		Count:              1,
		ReportingComponent: eventpipev1.ComponentAgent,
		Sandbox:            sb,
		Attribution:        rule,
		Role:               eventpipev1.RoleSandbox,
	}
}

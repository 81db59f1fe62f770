package gateway

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// A sandbox deleted and created again under its name (a new id) while the
// old pods' pull failures still arrive: the driver's view of the new id
// gets no condition or Ready suffix from the old id, the old id's state is
// forgotten at its deletion, and its late Events are not relayed.
func TestReplacedSandboxFailureStaysWithTheOldID(t *testing.T) {
	const oldID, newID = "0d1e2f30-4152-4637-8495-a6b7c8d9e0f1", "9a8b7c6d-5e4f-4031-9213-243546576879"
	h := testHub(t, nil)
	deletedAt := timestamppb.New(time.Unix(1_790_000_100, 0))
	gone := func(o *eventpipev1.Occurrence) *eventpipev1.Occurrence {
		o.Sandbox.DeletedAt = deletedAt
		return o
	}
	deletion := gone(at(occurrence(oldID, eventpipev1.ReasonSandboxDeleted, "", "Sandbox web was deleted"), 100*time.Second))
	deletion.ReportingComponent, deletion.EventId = eventpipev1.ComponentAgent, eventpipev1.DeletionEventIDPrefix+"old-cr"

	h.apply(1, at(pullFailed(oldID, 5), 10*time.Second), false)
	if _, ok := h.patchFor(oldID); !ok {
		t.Fatal("the old id's failure is not active before its deletion")
	}
	h.apply(2, at(pulledAgent(newID), 110*time.Second), false)
	h.apply(3, deletion, false)
	late := gone(at(pullFailed(oldID, 6), 120*time.Second))
	late.EventId = "late/1"
	h.apply(4, late, false)

	if p, ok := h.patchFor(newID); ok {
		t.Errorf("the new id carries a condition: %+v", p)
	}
	if p, ok := h.patchFor(oldID); ok {
		t.Errorf("the deleted id still carries a condition: %+v", p)
	}
	if h.anyBlocked() {
		t.Error("a failure is counted after the only failing sandbox was deleted")
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if _, ok := h.sandboxes[sandboxKey(oldID)]; ok {
		t.Error("the deleted id is still kept")
	}
	for i := h.logNext - uint64(h.logLen); i < h.logNext; i++ {
		if e := h.log[i%uint64(len(h.log))]; e.sandboxID == oldID && e.cursor > 2 {
			t.Errorf("relayed an event of the deleted id at cursor %d", e.cursor)
		}
	}
}

// The same for the other blockers: the old id was unschedulable and its
// creation refused; the new id under the same name (the same CR and pod
// names in managed mode) starts with nothing, gets its own blocker only
// from its own occurrences, and the old id's late Events stay with it.
func TestReplacedSandboxBlockersStayWithTheOldID(t *testing.T) {
	const oldID, newID = "0d1e2f30-4152-4637-8495-a6b7c8d9e0f1", "9a8b7c6d-5e4f-4031-9213-243546576879"
	h := testHub(t, nil)
	of := func(id string, o *eventpipev1.Occurrence) *eventpipev1.Occurrence {
		o.Sandbox.Id = id
		return o
	}
	h.apply(1, of(oldID, at(failedScheduling(), 10*time.Second)), false)
	h.apply(2, of(oldID, at(readyCondition(true, 1), 11*time.Second)), false)
	if p, ok := h.patchFor(oldID); !ok || len(p.Add) != 2 {
		t.Fatalf("the old id's blockers: %+v", p.Add)
	}
	deletion := of(oldID, at(occurrence(oldID, eventpipev1.ReasonSandboxDeleted, "", "Sandbox no-cpu was deleted"), 100*time.Second))
	deletion.ReportingComponent, deletion.EventId = eventpipev1.ComponentAgent, eventpipev1.DeletionEventIDPrefix+"old-cr"
	deletion.Sandbox.DeletedAt = timestamppb.New(time.Unix(1_790_000_100, 0))
	h.apply(3, deletion, false)
	late := of(oldID, at(failedScheduling(), 105*time.Second))
	late.Sandbox.DeletedAt = deletion.Sandbox.DeletedAt
	h.apply(4, late, false)
	// The new sandbox: same pod name, its own id.
	h.apply(5, of(newID, at(kubelet("no-cpu", "Pulling", "workspace-init"), 110*time.Second)), false)
	if p, ok := h.patchFor(newID); ok {
		t.Errorf("the new id carries the old id's blockers: %+v", p)
	}
	if p, ok := h.patchFor(oldID); ok {
		t.Errorf("the deleted id still carries a condition: %+v", p)
	}
	if h.anyBlocked() || h.folder.Len() != 1 {
		t.Errorf("blocked %v, %d sandboxes folded, want only the new id, unblocked", h.anyBlocked(), h.folder.Len())
	}
	h.apply(6, of(newID, at(failedScheduling(), 120*time.Second)), false)
	if p, ok := h.patchFor(newID); !ok || len(p.Add) != 1 || p.Add[0].Type != ConditionScheduled {
		t.Errorf("the new id's own blocker: %+v", p.Add)
	}
}

package diagnosis

import (
	"fmt"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// configStatus is the pod status the agent diagnoses for an agent container
// whose Secret lacks a key, observed at the fixture's clock plus skew.
func (f *fixture) configStatus(s sandbox, skew time.Duration) *eventpipev1.Occurrence {
	f.t.Helper()
	p := *f.lk.pods[s.ns+"/"+s.name]
	p.ResourceVersion = fmt.Sprint(2000 + f.seq)
	f.seq++
	p.Containers = append([]enrich.Container(nil), p.Containers...)
	p.Containers[2].WaitingReason = "CreateContainerConfigError"
	p.Containers[2].WaitingMessage = "couldn't find key token in Secret " + s.ns + "/sandbox-credentials"
	os := f.en.DiagnosePod(&p, f.now.Add(skew))
	if len(os) != 1 || os[0].GetBlocker().GetCause() != eventpipev1.BlockerKeyNotFound {
		f.t.Fatalf("config status: diagnosed %v", os)
	}
	return os[0]
}

// TestActive: the blockers a reader holding only a read lock sees, crash
// blockers settled by the clock it passes, nothing changed by the read;
// Forget drops a sandbox.
func TestActive(t *testing.T) {
	s := newSandbox(1, "crashes", workloadImage, supervisorGood)
	fx := newFixture(t, s)
	fd := &feed{f: NewFolder()}
	fd.add(fx.crashRound(s, 1, "Error", 1))
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 1 || got[0].Kind != eventpipev1.BlockerKindContainer {
		t.Fatalf("crash loop: active %+v", got)
	}
	started := fx.kubeletEvent(s, false, "agent", "Normal", "Started", "Started container agent", 2)
	fd.add(one(started))
	at := started.GetOccurredAt().AsTime()
	if got, until := fd.f.Active(s.id, at.Add(DefaultCrashSettle-time.Second)); len(got) != 1 || !until.Equal(at.Add(DefaultCrashSettle)) {
		t.Errorf("before it settled: active %+v until %v", got, until)
	}
	if got, _ := fd.f.Active(s.id, at.Add(DefaultCrashSettle)); len(got) != 0 {
		t.Errorf("settled: active %+v", got)
	}
	// The read changed nothing: an earlier clock sees it again.
	if got, _ := fd.f.Active(s.id, at); len(got) != 1 {
		t.Errorf("after a read at a later time: active %+v", got)
	}
	if got, _ := fd.f.Active("no-such-id", at); got != nil {
		t.Errorf("unknown id: %+v", got)
	}
	fd.f.Forget(s.id)
	if got, _ := fd.f.Active(s.id, at); got != nil || fd.f.Len() != 0 {
		t.Errorf("forgotten: active %+v, %d sandboxes", got, fd.f.Len())
	}
}

// TestFoldStartedInTheSecondOfAStatus: a waiting status the agent observed
// half a second into the second the kubelet's Started names (kubelet stamps
// Events to the second) is not later than the Started: the container runs
// and its blocker ends. Compared to the nanosecond, the status looked later,
// the blocker stayed, and nothing that followed (no Event for a running
// container) would ever end it.
func TestFoldStartedInTheSecondOfAStatus(t *testing.T) {
	s := newSandbox(2, "keyfix", workloadImage, supervisorGood)
	fx := newFixture(t, s)
	fd := &feed{f: NewFolder()}
	status := fx.configStatus(s, time.Second+500*time.Millisecond)
	fd.add(one(status))
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 1 {
		t.Fatalf("key not found: active %+v", got)
	}
	started := fx.kubeletEvent(s, false, "agent", "Normal", "Started", "Started container agent", 1)
	if !started.GetOccurredAt().AsTime().Before(status.GetOccurredAt().AsTime()) {
		t.Fatalf("fixture: the Started (%v) should read earlier than the status (%v)", started.GetOccurredAt().AsTime(), status.GetOccurredAt().AsTime())
	}
	fd.add(one(started))
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 0 {
		t.Errorf("the container started: active %+v", got)
	}
	// Read after the Started, a report from its second stays ended.
	fd.add(one(fx.configStatus(s, 700*time.Millisecond)))
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 0 {
		t.Errorf("a report in the Started's second, read after it: active %+v", got)
	}
	// A report a second later blocks again.
	fx.now = fx.now.Add(time.Second)
	fd.add(one(fx.configStatus(s, 0)))
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 1 {
		t.Errorf("a later failure: active %+v", got)
	}
}

// TestFoldAgentPullEndsInitPulls: the workload pod's agent container got its
// image, so its init containers (which run first) got theirs: their pull
// blockers end and a late report of an earlier failure does not reopen one;
// the supervisor pod's own failure stays.
func TestFoldAgentPullEndsInitPulls(t *testing.T) {
	s := newSandbox(3, "initfix", imageMissing, supervisorBad)
	fx := newFixture(t, s)
	fd := &feed{f: NewFolder()}
	fd.add(fx.pullFailure(s, true, "supervisor", supervisorBad, 1))
	late := fx.pullFailure(s, false, "workspace-init", imageMissing, 1)
	fd.add(late[:2])
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 2 {
		t.Fatalf("before: active %+v", got)
	}
	fd.add(fx.start(s, false, "agent", imageMissing))
	got, _ := fd.f.Active(s.id, fx.now)
	if len(got) != 1 || got[0].ImageRole != eventpipev1.ImageRoleSupervisor {
		t.Errorf("after the agent's pull: active %+v, want the supervisor image only", got)
	}
	fd.add(late[2:])
	if got, _ := fd.f.Active(s.id, fx.now); len(got) != 1 {
		t.Errorf("late reports of the init container's failure: active %+v", got)
	}
}

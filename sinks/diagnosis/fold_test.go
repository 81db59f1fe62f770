package diagnosis

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// feed adds occurrences with increasing cursors.
type feed struct {
	f      *Folder
	cursor uint64
}

func (fd *feed) add(os ...[]*eventpipev1.Occurrence) {
	for _, batch := range os {
		for _, o := range batch {
			fd.cursor++
			fd.f.Add(fd.cursor, o)
		}
	}
}

func mustSandbox(t *testing.T, f *Folder, id string) Diagnosis {
	t.Helper()
	d, ok := f.Sandbox(id)
	if !ok {
		t.Fatalf("sandbox %s not folded", id)
	}
	return d
}

func TestFoldWorkloadImageMissing(t *testing.T) {
	s := newSandbox(1, "img-missing", imageMissing, supervisorGood)
	fx := newFixture(t, s)
	fd := &feed{f: NewFolder()}
	fd.add(fx.start(s, true, "supervisor", supervisorGood))
	fd.add(fx.pullFailure(s, false, "workspace-init", imageMissing, 1))

	d := mustSandbox(t, fd.f, s.id)
	if d.State != StateBlocked || len(d.Blockers) != 1 {
		t.Fatalf("after one failed pull: state %s, blockers %+v", d.State, d.Blockers)
	}
	b := d.Blockers[0]
	want := Blocker{Kind: KindImagePull, Cause: eventpipev1.CategoryNotFound, Image: imageMissing,
		ImageRole: eventpipev1.ImageRoleWorkload, Role: eventpipev1.RoleWorkload, Namespace: s.ns, Pod: s.name,
		Container: "workspace-init", Node: nodeName, Disposition: eventpipev1.DispositionRetrying,
		DecidedBy: eventpipev1.DecidedByTextRule, Confidence: eventpipev1.ConfidenceCertain}
	got := b
	got.Attempts, got.Since, got.LastSeen, got.Detail, got.Remedy, got.EventID, got.Cursor = 0, time.Time{}, time.Time{}, "", "", "", 0
	if got != want {
		t.Errorf("blocker\n got %+v\nwant %+v", got, want)
	}
	if b.Attempts < 1 || b.Since.IsZero() || b.LastSeen.Before(b.Since) || b.EventID == "" || b.Cursor == 0 {
		t.Errorf("attempts/since/last_seen/event/cursor not filled: %+v", b)
	}
	wantFix := "tag 0.0.0-does-not-exist does not exist in docker.io/library/busybox: check the image the sandbox was created with"
	if b.Remedy != wantFix {
		t.Errorf("remedy %q, want %q", b.Remedy, wantFix)
	}
	if !strings.Contains(b.Detail, "not found") {
		t.Errorf("detail %q lacks the runtime's words", b.Detail)
	}
	if d.Name != "img-missing" || d.Workspace != workspace || d.GatewayID != gatewayID {
		t.Errorf("identity: %+v", d)
	}

	// The kubelet retries; after enough failures retrying will not fix it.
	fd.add(fx.pullFailure(s, false, "workspace-init", imageMissing, 2))
	fd.add(fx.pullFailure(s, false, "workspace-init", imageMissing, 3))
	d = mustSandbox(t, fd.f, s.id)
	if len(d.Blockers) != 1 {
		t.Fatalf("blockers after three rounds: %+v", d.Blockers)
	}
	if b2 := d.Blockers[0]; b2.Disposition != eventpipev1.DispositionPersistent || b2.Attempts < 3 || !b2.Since.Equal(b.Since) && b2.Since.After(b.Since) {
		t.Errorf("after three rounds: disposition %s attempts %d since %v (first %v)", b2.Disposition, b2.Attempts, b2.Since, b.Since)
	}
	if d.Occurrences != int(fd.cursor) || d.Cursor != fd.cursor {
		t.Errorf("occurrences %d cursor %d, want %d", d.Occurrences, d.Cursor, fd.cursor)
	}
}

func TestFoldSupervisorBadTagAndGrouping(t *testing.T) {
	a := newSandbox(2, "sup-bad", workloadImage, supervisorBad)
	b := newSandbox(3, "sup-bad-2", workloadImage, supervisorBad)
	c := newSandbox(4, "img-missing", imageMissing, supervisorGood)
	fx := newFixture(t, a, b, c)
	fd := &feed{f: NewFolder()}
	fd.add(fx.start(a, false, "workspace-init", workloadImage), fx.start(a, false, "agent", workloadImage))
	for n := int32(1); n <= 3; n++ {
		fd.add(fx.pullFailure(a, true, "supervisor", supervisorBad, n))
	}
	fd.add(fx.pullFailure(b, true, "supervisor", supervisorBad, 1))
	fd.add(fx.pullFailure(c, false, "workspace-init", imageMissing, 1))

	d := mustSandbox(t, fd.f, a.id)
	if len(d.Blockers) != 1 {
		t.Fatalf("sup-bad blockers: %+v", d.Blockers)
	}
	bl := d.Blockers[0]
	if bl.ImageRole != eventpipev1.ImageRoleSupervisor || bl.Image != supervisorBad || bl.Cause != eventpipev1.CategoryNotFound ||
		bl.Pod != a.supervisorPod() || bl.Container != "supervisor" || bl.Role != eventpipev1.RoleSupervisor {
		t.Errorf("sup-bad blocker: %+v", bl)
	}
	wantFix := "tag 0.0.0-does-not-exist does not exist in ghcr.io/nvidia/openshell/supervisor: check the supervisor image setting of the gateway"
	if bl.Remedy != wantFix {
		t.Errorf("remedy %q, want %q", bl.Remedy, wantFix)
	}

	groups := Supervisor(fd.f.Sandboxes())
	if len(groups) != 1 {
		t.Fatalf("supervisor groups: %+v", groups)
	}
	g := groups[0]
	if g.Image != supervisorBad || g.GatewayID != gatewayID || len(g.Sandboxes) != 2 || g.Remedy != wantFix {
		t.Errorf("group: %+v", g)
	}
	if g.Disposition != eventpipev1.DispositionPersistent {
		t.Errorf("group disposition %s: one sandbox's failure is persistent", g.Disposition)
	}
	db := mustSandbox(t, fd.f, b.id)
	if g.Attempts != bl.Attempts+db.Blockers[0].Attempts {
		t.Errorf("group attempts %d, want %d+%d", g.Attempts, bl.Attempts, db.Blockers[0].Attempts)
	}
	names := []string{g.Sandboxes[0].Name, g.Sandboxes[1].Name}
	if !(names[0] == "sup-bad" && names[1] == "sup-bad-2" || names[0] == "sup-bad-2" && names[1] == "sup-bad") {
		t.Errorf("group sandboxes %v", names)
	}

	var out bytes.Buffer
	if err := WriteSupervisor(&out, groups, fx.now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"supervisor image " + supervisorBad + " of gateway openshell: not_found", "blocks 2 sandboxes", "fix: " + wantFix, "persistent: retrying will not fix it"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("supervisor text lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFoldClears(t *testing.T) {
	healthy := newSandbox(5, "healthy", workloadImage, supervisorGood)
	recovers := newSandbox(6, "recovers", imageMissing, supervisorGood)
	retagged := newSandbox(7, "retagged", imageMissing, supervisorGood)
	fx := newFixture(t, healthy, recovers, retagged)
	fd := &feed{f: NewFolder()}
	fd.add(fx.start(healthy, true, "supervisor", supervisorGood), fx.start(healthy, false, "workspace-init", workloadImage),
		fx.start(healthy, false, "agent", workloadImage))
	fd.add(fx.pullFailure(recovers, false, "workspace-init", imageMissing, 1))
	if d := mustSandbox(t, fd.f, recovers.id); d.State != StateBlocked {
		t.Fatalf("recovers: state %s before the pull succeeded", d.State)
	}
	// An old Pulled (before the failure) does not clear it.
	old := fx.start(recovers, false, "workspace-init", imageMissing)[0]
	old.OccurredAt = timestamppb.New(fx.now.Add(-time.Hour))
	fd.add([]*eventpipev1.Occurrence{old})
	if d := mustSandbox(t, fd.f, recovers.id); d.State != StateBlocked {
		t.Errorf("a Pulled older than the failure cleared it")
	}
	pulled := fx.start(recovers, false, "workspace-init", imageMissing)
	fd.add(pulled)
	// A waiting status the agent saw 84 ms into the Pulled's second (kubelet
	// stamps Events to the second) is the same moment, not a new failure;
	// one a second later is.
	last := pulled[0].GetOccurredAt().AsTime()
	for _, o := range pulled {
		if t := o.GetOccurredAt().AsTime(); t.After(last) {
			last = t
		}
	}
	late := fx.pullFailure(recovers, false, "workspace-init", imageMissing, 1)[1]
	late.OccurredAt = timestamppb.New(last.Truncate(time.Second).Add(84 * time.Millisecond))
	fd.add([]*eventpipev1.Occurrence{late})
	if d := mustSandbox(t, fd.f, recovers.id); d.State != StateClear {
		t.Errorf("a failure in the same second as the Pulled reopened it: %+v", d.Blockers)
	}
	again := fx.pullFailure(recovers, false, "workspace-init", imageMissing, 1)[1]
	again.OccurredAt = timestamppb.New(last.Truncate(time.Second).Add(time.Second + 84*time.Millisecond))
	fd.add([]*eventpipev1.Occurrence{again})
	if d := mustSandbox(t, fd.f, recovers.id); d.State != StateBlocked {
		t.Errorf("a failure a second after the Pulled did not block")
	}
	fd.add(fx.start(recovers, false, "workspace-init", imageMissing)[:1:1])
	// Another image for the same container replaces the blocker.
	fd.add(fx.pullFailure(retagged, false, "workspace-init", imageMissing, 1))
	other := "docker.io/library/busybox:0.0.1-nor-this"
	fx.lk.pods[retagged.ns+"/"+retagged.name].Containers[1].Image = other // the sandbox was re-created with another image
	fd.add(fx.pullFailure(retagged, false, "workspace-init", other, 1))

	for _, tc := range []struct {
		s     sandbox
		state string
	}{{healthy, StateClear}, {recovers, StateClear}, {retagged, StateBlocked}} {
		d := mustSandbox(t, fd.f, tc.s.id)
		if d.State != tc.state {
			t.Errorf("%s: state %s, want %s (blockers %+v)", tc.s.name, d.State, tc.state, d.Blockers)
		}
	}
	d := mustSandbox(t, fd.f, retagged.id)
	if len(d.Blockers) != 1 || d.Blockers[0].Image != other {
		t.Errorf("retagged: blockers %+v, want one for %s", d.Blockers, other)
	}
	h := mustSandbox(t, fd.f, healthy.id)
	if h.Last == nil || h.Last.Reason != "Started" || h.Progress == "" {
		t.Errorf("healthy: last %+v progress %q", h.Last, h.Progress)
	}
	var out bytes.Buffer
	if err := WriteText(&out, h, fx.now); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "sandbox healthy  workspace repro  id "+healthy.id) || !strings.Contains(out.String(), "nothing blocks it: last event Started pod/healthy (agent)") {
		t.Errorf("healthy text:\n%s", out.String())
	}
	if got := fd.f.Find("recovers", ""); len(got) != 1 || got[0].ID != recovers.id {
		t.Errorf("Find(recovers): %+v", got)
	}
	if got := fd.f.Find("recovers", "elsewhere"); len(got) != 0 {
		t.Errorf("Find in another workspace: %+v", got)
	}
}

func TestFoldBounds(t *testing.T) {
	a := newSandbox(8, "a", imageMissing, supervisorGood)
	b := newSandbox(9, "b", imageMissing, supervisorGood)
	fx := newFixture(t, a, b)
	f := NewFolder()
	f.MaxSandboxes = 1
	fd := &feed{f: f}
	fd.add(fx.pullFailure(a, false, "workspace-init", imageMissing, 1))
	fd.add(fx.pullFailure(b, false, "workspace-init", imageMissing, 1))
	if f.Len() != 1 || f.Dropped() != 5 {
		t.Errorf("len %d dropped %d, want 1 and 5", f.Len(), f.Dropped())
	}
	// Unattributed occurrences are not folded (and not counted as dropped).
	if f.Add(99, &eventpipev1.Occurrence{Reason: "Failed"}) || f.Dropped() != 5 {
		t.Errorf("an unattributed occurrence was folded")
	}
}

func TestWriteTableCleansClusterStrings(t *testing.T) {
	d := Diagnosis{ID: "x", Name: "evil\x1b[31mname", Workspace: "w", State: StateBlocked, Blockers: []Blocker{{
		Kind: KindImagePull, Cause: "not_found", Image: "a:1\nINJECTED", ImageRole: "workload", Attempts: 2,
		Disposition: "retrying", Remedy: "fix\rit", Since: time.Unix(100, 0)}}}
	var out bytes.Buffer
	if err := WriteTable(&out, []Diagnosis{d}, time.Unix(160, 0)); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if strings.Contains(s, "\x1b") || strings.Contains(s, "\nINJECTED") || strings.Contains(s, "\r") {
		t.Errorf("control characters reached the output: %q", s)
	}
	if !strings.Contains(s, "1m00s ago") || !strings.Contains(s, "fix evil") {
		t.Errorf("table: %q", s)
	}
}

// TestWriteShowsHowSure: the text and the table say how a cause was decided
// and how sure it is; an unrecognised blocker's fix line gives no step.
func TestWriteShowsHowSure(t *testing.T) {
	d := Diagnosis{ID: "x", Name: "n", Workspace: "w", State: StateBlocked, Blockers: []Blocker{
		{Kind: KindImagePull, Cause: "unauthorized", DecidedBy: "text_rule", Confidence: "likely", Image: "a:1", ImageRole: "workload",
			Attempts: 2, Disposition: "retrying", Remedy: "add a pull secret", Since: time.Unix(100, 0)},
		{Kind: "create_refused", Cause: "unrecognised", DecidedBy: "text_rule", Confidence: "weak", Object: "ReplicaSet/r",
			Detail: "the moon is in the wrong phase", Attempts: 1, Disposition: "retrying", Since: time.Unix(100, 0)},
	}}
	var text, table bytes.Buffer
	if err := WriteText(&text, d, time.Unix(160, 0)); err != nil {
		t.Fatal(err)
	}
	if err := WriteTable(&table, []Diagnosis{d}, time.Unix(160, 0)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"workload image a:1: unauthorized [text rule, likely]",
		"create_refused: unrecognised (ReplicaSet/r) [text rule, weak]",
		"detail: the moon is in the wrong phase",
		"fix: none: eventpipe does not recognise the cause; the runtime's words are above",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	if !strings.Contains(table.String(), "unauthorized (likely)") || !strings.Contains(table.String(), "unrecognised (weak)") {
		t.Errorf("table:\n%s", table.String())
	}
}

// TestWriteTableOneLinePerFix: make run's taint sandbox, on the real
// scheduler, has two unschedulable blockers (its workload pod and its
// supervisor pod both meet the taint) with one fix: the table says it once.
func TestWriteTableOneLinePerFix(t *testing.T) {
	remedy := "the nodes that could run the pod carry a taint it does not tolerate: add the toleration to the sandbox's pod template, or untaint a node"
	d := Diagnosis{ID: "x", Name: "taint", Workspace: "taint", State: StateBlocked, Blockers: []Blocker{
		{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerUntoleratedTaint, Object: "Pod/os-supervisor-x", Pod: "os-supervisor-x", Remedy: remedy, Attempts: 1, Since: time.Unix(100, 0)},
		{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerUntoleratedTaint, Object: "Pod/taint", Pod: "taint", Remedy: remedy, Attempts: 1, Since: time.Unix(100, 0)},
	}}
	var out bytes.Buffer
	if err := WriteTable(&out, []Diagnosis{d}, time.Unix(160, 0)); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "fix taint (unschedulable): "+remedy); n != 1 {
		t.Errorf("%d fix lines for one fix:\n%s", n, out.String())
	}
	if n := strings.Count(out.String(), "untolerated_taint"); n != 2 {
		t.Errorf("%d blocker rows, want 2:\n%s", n, out.String())
	}
}

// TestFoldLateRecurrenceDoesNotReopen: seen with the real kube-scheduler
// (make run's healthy sandbox): the scheduler tried the pod before its
// workspace claim was bound and wrote FailedScheduling (unbound_pvc), the
// pod was then scheduled and started, and the scheduler's update of that
// FailedScheduling's series (last observed before the Started) reached
// the collector after the Started. It must not block the sandbox again; a
// report observed after the Started must.
func TestFoldLateRecurrenceDoesNotReopen(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 2, 5, 448_000_000, time.UTC)
	sb := &eventpipev1.Sandbox{Id: "2ff21e26-1a7b-49a2-a640-14ae153f9301", Name: "healthy", Workspace: "healthy"}
	pod := &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "openshell-openshell-healthy", Name: "healthy"}
	failed := func(id string, last time.Time, attempts uint32) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{EventId: id, Sandbox: sb, InvolvedObject: pod, Type: "Warning", Reason: "FailedScheduling",
			Message: "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found", OccurredAt: timestamppb.New(last),
			Blocker: &eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerUnboundPVC, Object: "Pod/healthy",
				Attempts: attempts, FirstSeen: timestamppb.New(t0), LastSeen: timestamppb.New(last)}}
	}
	started := &eventpipev1.Occurrence{EventId: "started/1", Sandbox: sb, InvolvedObject: pod, Type: "Normal", Reason: "Started",
		Message: "Container started", Container: "agent", OccurredAt: timestamppb.New(t0.Add(4 * time.Second).Truncate(time.Second))}
	fd := &feed{f: NewFolder()}
	fd.add([]*eventpipev1.Occurrence{failed("fs/1", t0, 1), started})
	if d := mustSandbox(t, fd.f, sb.Id); d.State != StateClear {
		t.Fatalf("after Started: state %s, blockers %+v", d.State, d.Blockers)
	}
	fd.add([]*eventpipev1.Occurrence{failed("fs/2", t0.Add(61*time.Millisecond), 3)})
	if d := mustSandbox(t, fd.f, sb.Id); d.State != StateClear {
		t.Errorf("a late report observed before the Started reopened the blocker: %+v", d.Blockers)
	}
	fd.add([]*eventpipev1.Occurrence{failed("fs/3", t0.Add(10*time.Second), 4)})
	if d := mustSandbox(t, fd.f, sb.Id); d.State != StateBlocked {
		t.Errorf("a report observed after the Started did not block: state %s", d.State)
	}
}

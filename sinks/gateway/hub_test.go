package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
)

func testHub(t *testing.T, mod func(*FollowConfig)) *hub {
	t.Helper()
	cfg := NewDefaultConfig().Follow
	if mod != nil {
		mod(&cfg)
	}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newHub(cfg, m)
}

// at sets the occurrence's time, and its diagnosis's first and last
// sighting with it (the enricher's last sighting is the occurrence's own).
func at(o *eventpipev1.Occurrence, d time.Duration) *eventpipev1.Occurrence {
	o.OccurredAt = timestamppb.New(time.Unix(1_790_000_000, 0).Add(d))
	if pf := o.GetPullFailure(); pf != nil {
		pf.FirstSeen, pf.LastSeen = o.OccurredAt, o.OccurredAt
	}
	if b := o.GetBlocker(); b != nil {
		b.FirstSeen, b.LastSeen = o.OccurredAt, o.OccurredAt
	}
	return o
}

func supervisorFailure(id string) *eventpipev1.Occurrence {
	o := pullFailed(id, 1)
	o.Role, o.Container, o.ImageRole = eventpipev1.RoleSupervisor, "supervisor", eventpipev1.ImageRoleSupervisor
	o.PullFailure.Image = "ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist"
	return o
}

// podStatusFailure is the agent's diagnosis of a waiting container
// (ImagePullBackOff in the pod's status), stamped when the agent saw it.
func podStatusFailure(id string) *eventpipev1.Occurrence {
	o := pullFailed(id, 1)
	o.Reason, o.PullFailure.Source = "ImagePullBackOff", eventpipev1.PullSourcePodStatus
	return o
}

func pulledOf(id, role, container string) *eventpipev1.Occurrence {
	o := pulledAgent(id)
	o.Role, o.Container = role, container
	return o
}

// TestFailureState: which occurrences make a failure active and which
// clear it.
func TestFailureState(t *testing.T) {
	const id = "7f7c2c8e-4a9b-4c1e-9e57-1f0b3a9d2c11"
	for _, tc := range []struct {
		name     string
		occs     []*eventpipev1.Occurrence
		wantRole string // "" = no condition
	}{
		{"workload failure", []*eventpipev1.Occurrence{at(pullFailed(id, 1), 0)}, "workload"},
		{"cleared by the agent's Pulled", []*eventpipev1.Occurrence{at(pullFailed(id, 1), 0), at(pulledAgent(id), time.Second)}, ""},
		{"not cleared by another init container's Pulled", []*eventpipev1.Occurrence{at(pullFailed(id, 1), 0),
			at(pulledOf(id, eventpipev1.RoleWorkload, "openshell-network-init"), time.Second)}, "workload"},
		{"cleared by the same container's Pulled", []*eventpipev1.Occurrence{at(pullFailed(id, 1), 0),
			at(pulledOf(id, eventpipev1.RoleWorkload, "workspace-init"), time.Second)}, ""},
		{"a failure older than the Pulled, read late, stays cleared", []*eventpipev1.Occurrence{at(pulledAgent(id), time.Second), at(pullFailed(id, 1), 0)}, ""},
		{"a new failure after the Pulled is active", []*eventpipev1.Occurrence{at(pulledAgent(id), 0), at(pullFailed(id, 1), time.Second)}, "workload"},
		{"the supervisor pod is not cleared by the agent", []*eventpipev1.Occurrence{at(pulledAgent(id), 0), at(supervisorFailure(id), time.Second),
			at(pulledAgent(id), 2*time.Second)}, "supervisor"},
		{"the supervisor pod cleared by its own Pulled", []*eventpipev1.Occurrence{at(supervisorFailure(id), 0),
			at(pulledOf(id, eventpipev1.RoleSupervisor, "supervisor"), time.Second)}, ""},
		// kubelet's Pulled carries a whole second; a pod status observed
		// 84 ms into that second cannot be ordered against it.
		{"a pod status in the Pulled's second, read before it, is cleared", []*eventpipev1.Occurrence{at(podStatusFailure(id), 84*time.Millisecond),
			at(pulledAgent(id), 0)}, ""},
		{"a pod status in the Pulled's second, read after it, stays cleared", []*eventpipev1.Occurrence{at(pulledAgent(id), 0),
			at(podStatusFailure(id), 84*time.Millisecond)}, ""},
		{"a pod status a second after the Pulled is active", []*eventpipev1.Occurrence{at(pulledAgent(id), 0),
			at(podStatusFailure(id), time.Second+84*time.Millisecond)}, "workload"},
		{"latest of two active failures wins", []*eventpipev1.Occurrence{at(pullFailed(id, 1), 0), at(supervisorFailure(id), time.Second)}, "supervisor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHub(t, nil)
			for i, o := range tc.occs {
				h.apply(uint64(i+1), o, false)
			}
			p, ok := h.patchFor(id)
			if tc.wantRole == "" {
				if ok || h.anyBlocked() {
					t.Errorf("condition %+v, want none", p.Add)
				}
				return
			}
			if !ok || len(p.Add) != 1 {
				t.Fatalf("no condition")
			}
			c := p.Add[0]
			if c.Type != "ImagePulled" || c.Status != "False" || c.Reason != "NotFound" || p.ReadySuffix != "[eventpipe] "+c.Message {
				t.Errorf("condition %+v suffix %q", c, p.ReadySuffix)
			}
			if want := tc.wantRole + " image "; len(c.Message) < len(want) || c.Message[:len(want)] != want {
				t.Errorf("message %q, want it to start with %q", c.Message, want)
			}
		})
	}
}

func TestReason(t *testing.T) {
	for _, tc := range []struct{ kind, cause, want string }{
		{diagnosis.KindImagePull, eventpipev1.CategoryNotFound, "NotFound"},
		{diagnosis.KindImagePull, eventpipev1.CategoryTLSError, "TLSError"},
		{diagnosis.KindImagePull, eventpipev1.CategoryNotFoundOrUnauthorized, "NotFoundOrUnauthorized"},
		{diagnosis.KindImagePull, "container_exited", "PullContainerExited"},
		{diagnosis.KindImagePull, "", "PullUnknown"},
		{diagnosis.KindImagePull, "quota-exceeded", "PullQuotaExceeded"},
		{eventpipev1.BlockerKindContainer, eventpipev1.BlockerOOMKilled, "OOMKilled"},
		{eventpipev1.BlockerKindCreateRefused, eventpipev1.BlockerQuotaExceeded, "QuotaExceeded"},
		{eventpipev1.BlockerKindContainer, "container_stopped", "BlockedContainerStopped"},
		{eventpipev1.BlockerKindVolume, "", "BlockedUnknown"},
	} {
		if got := reason(tc.kind, tc.cause); got != tc.want {
			t.Errorf("reason(%q, %q) = %q, want %q", tc.kind, tc.cause, got, tc.want)
		}
	}
	// Every category and every shown cause this build writes has a reason
	// of its own (not the word-by-word fallback meant for a newer agent).
	for _, cat := range eventpipev1.PullCategories {
		if _, ok := reasons[cat]; !ok {
			t.Errorf("category %s has no condition reason (falls back to %s)", cat, reason(diagnosis.KindImagePull, cat))
		}
	}
	for _, cause := range eventpipev1.BlockerCauses {
		if _, ok := reasons[cause]; !ok && shown(&diagnosis.Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: cause}) {
			t.Errorf("cause %s has no condition reason (falls back to %s)", cause, reason(eventpipev1.BlockerKindContainer, cause))
		}
	}
	// No category or cause maps to a reason the gateway acts on.
	for cat := range reasons {
		switch r := reason("", cat); r {
		case "ContainerExited", "ContainerStopped", "PodTerminating", "PodNotTerminated", "ReconcilerError",
			"DependenciesNotReady", "SupervisorNotConnected", "Starting", "ContainerStarting", "ContainerCreated",
			"HealthCheckStarting", "InspectFailed":
			t.Errorf("category %s maps to reserved reason %s", cat, r)
		}
	}
}

// TestHubBounds: sandboxes and tail events stay within their limits.
func TestHubBounds(t *testing.T) {
	h := testHub(t, func(c *FollowConfig) { c.MaxSandboxes, c.MaxEvents, c.TailPerSandbox = 100, 250, 5 })
	for i := range 1000 {
		h.apply(uint64(i+1), pullFailed(fmt.Sprintf("00000000-0000-4000-8000-%012d", i%300), 1), false)
	}
	if n := len(h.sandboxes); n != 100 {
		t.Errorf("%d sandboxes kept, want 100", n)
	}
	total := 0
	for _, s := range h.sandboxes {
		if len(s.tail) > 5 {
			t.Errorf("tail of %d", len(s.tail))
		}
		total += len(s.tail)
	}
	if total > 250 || total != h.events {
		t.Errorf("%d events kept (counter %d), want at most 250", total, h.events)
	}
	if h.pulling != 100 || h.blocked != 100 || h.folder.Len() != 100 {
		t.Errorf("pulling = %d, blocked = %d, folded %d, want 100", h.pulling, h.blocked, h.folder.Len())
	}
}

// TestStreamLogOverrun: a stream that falls more than MaxEvents behind
// is told so (counted) and continues from the oldest event kept; what the
// tails still hold is offered to it; nothing is sent twice.
func TestStreamLogOverrun(t *testing.T) {
	h := testHub(t, func(c *FollowConfig) { c.MaxEvents, c.TailPerSandbox = 10, 50 })
	sub, tail := h.subscribe(1)
	if len(tail) != 0 {
		t.Fatalf("tail %d on an empty hub", len(tail))
	}
	for i := range 25 {
		h.apply(uint64(i+1), pullFailed(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), 1), false)
	}
	batch, overrun := h.read(sub, 100)
	if !overrun || len(batch) != 10 || batch[0].cursor != 16 || batch[9].cursor != 25 {
		t.Fatalf("read: overrun %v, %d events from cursor %d", overrun, len(batch), batch[0].cursor)
	}
	for _, e := range batch {
		if !h.claim(sub, e) {
			t.Errorf("event %d refused", e.cursor)
		}
	}
	if p := h.pending(sub); len(p) != 0 {
		t.Errorf("pending after sending everything kept: %d", len(p))
	}
	if b, o := h.read(sub, 100); o || len(b) != 0 {
		t.Errorf("second read: %d events, overrun %v", len(b), o)
	}
	if h.claim(sub, batch[0]) {
		t.Errorf("an event was claimed twice")
	}
	// Live events without a tail still flow.
	h2 := testHub(t, func(c *FollowConfig) { c.TailPerSandbox = 0 })
	sub2, _ := h2.subscribe(1)
	h2.apply(1, pullFailed("00000000-0000-4000-8000-000000000001", 1), false)
	if b, _ := h2.read(sub2, 10); len(b) != 1 {
		t.Errorf("tail_per_sandbox 0: %d live events, want 1", len(b))
	}
}

// TestConditionSaysHowSure: an unrecognised cause is no category in the
// condition's message, only the runtime's words; a likely one says so; a
// certain one reads as before.
func TestConditionSaysHowSure(t *testing.T) {
	for _, tc := range []struct {
		name, category, confidence, detail string
		wantPrefix, wantReason             string
	}{
		{"certain", eventpipev1.CategoryNotFound, eventpipev1.ConfidenceCertain, "x: not found",
			"workload image docker.io/library/busybox:0.0.0-does-not-exist cannot be pulled: not_found (persistent", "NotFound"},
		{"likely", eventpipev1.CategoryUnauthorized, eventpipev1.ConfidenceLikely, "401 Unauthorized",
			"workload image docker.io/library/busybox:0.0.0-does-not-exist cannot be pulled: unauthorized (likely) (persistent", "Unauthorized"},
		{"unrecognised", eventpipev1.CategoryUnrecognised, eventpipev1.ConfidenceWeak, "the flux capacitor is misaligned",
			"workload image docker.io/library/busybox:0.0.0-does-not-exist cannot be pulled for a reason eventpipe does not recognise (persistent", "Unrecognised"},
	} {
		o := pullFailed("00000000-0000-4000-8000-000000000001", 3)
		o.PullFailure.Category, o.PullFailure.Confidence, o.PullFailure.Detail = tc.category, tc.confidence, tc.detail
		h := testHub(t, nil)
		h.apply(1, o, false)
		p, _ := h.patchFor(o.GetSandbox().GetId())
		if len(p.Add) != 1 {
			t.Fatalf("%s: conditions %+v", tc.name, p.Add)
		}
		c := p.Add[0]
		if !strings.HasPrefix(c.Message, tc.wantPrefix) || !strings.HasSuffix(c.Message, "; runtime: "+tc.detail) || c.Reason != tc.wantReason {
			t.Errorf("%s: reason %s message %q, want reason %s and %q ... %q", tc.name, c.Reason, c.Message, tc.wantReason, tc.wantPrefix, "; runtime: "+tc.detail)
		}
	}
}

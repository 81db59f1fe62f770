package gateway

import (
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestPlatformEventCarriesBlocker: an occurrence with a blocker reaches the
// gateway with the diagnosis in its keys (kind, cause, the object it names,
// container, disposition, attempts), not only the writer's words; one with
// neither a blocker nor a pull failure carries none of them.
func TestPlatformEventCarriesBlocker(t *testing.T) {
	base := func() *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{EventId: "u1/7", Reason: "FailedMount", Type: "Warning",
			Message:        `MountVolume.SetUp failed for volume "credentials" : secret "sandbox-credentials" not found`,
			InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Name: "web", Namespace: "ws"}, OccurredAt: timestamppb.Now()}
	}
	blocked := base()
	blocked.Blocker = &eventpipev1.Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerSecretNotFound,
		Object: "Secret/sandbox-credentials", Container: "agent", Disposition: eventpipev1.DispositionPersistent, Attempts: 3}
	refused := &eventpipev1.Occurrence{EventId: "sb/3", Reason: "ReconcilerError", Type: "Warning", OccurredAt: timestamppb.Now(),
		Blocker: &eventpipev1.Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerQuotaExceeded, Detail: "exceeded quota: pods"}}
	for _, tc := range []struct {
		name    string
		o       *eventpipev1.Occurrence
		want    map[string]string
		message string
	}{
		{"volume", blocked, map[string]string{KeyBlockerKind: "volume", KeyBlockerCause: "secret_not_found", KeyBlockerObject: "Secret/sandbox-credentials",
			KeyContainer: "agent", KeyDisposition: "persistent", KeyAttempts: "3"}, blocked.Message},
		{"no message: the detail", refused, map[string]string{KeyBlockerKind: "create_refused", KeyBlockerCause: "quota_exceeded"}, "exceeded quota: pods"},
		{"no blocker", base(), map[string]string{KeyBlockerKind: "", KeyBlockerCause: "", KeyBlockerObject: "", KeyDisposition: ""}, blocked.Message},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := platformEvent(tc.o)
			for k, v := range tc.want {
				if got, has := ev.Metadata[k]; got != v || (v == "" && has) {
					t.Errorf("%s = %q (set %v), want %q", k, got, has, v)
				}
			}
			if ev.Message != tc.message {
				t.Errorf("message %q, want %q", ev.Message, tc.message)
			}
		})
	}
}

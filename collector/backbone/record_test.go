package backbone

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestRecordRoundTrip(t *testing.T) {
	cases := []struct {
		name    string
		occ     *eventpipev1.Occurrence
		key     string
		subject string
	}{
		{
			name: "attributed",
			occ: &eventpipev1.Occurrence{
				EventId: "c1/3f2a/12", Cluster: "c1", Namespace: "openshell",
				OccurredAt: timestamppb.New(mustTime(t, "2026-12-01T10:00:00.5Z")),
				Reason:     "Failed", Message: `Failed to pull image "ghcr.io/nvidia/openshell/supervisor:0.0.0": not found`,
				Sandbox: &eventpipev1.Sandbox{Id: "sbx-1", Name: "demo", GatewayId: "gw-1"},
			},
			key: "sbx-1", subject: "sbx-1",
		},
		{
			name: "unattributed falls back to namespace/uid",
			occ: &eventpipev1.Occurrence{
				EventId: "c1/9/1", Cluster: "c1", Namespace: "default",
				InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Name: "p", Uid: "u-9"},
			},
			key: "default/u-9",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Encode(c.occ, "events")
			if err != nil {
				t.Fatal(err)
			}
			if string(r.Key) != c.key {
				t.Errorf("key %q, want %q", r.Key, c.key)
			}
			if got := header(r, HeaderSubject); got != c.subject {
				t.Errorf("ce_subject %q, want %q", got, c.subject)
			}
			if EventID(r) != c.occ.GetEventId() || Stream(r) != "events" || header(r, HeaderCluster) != "c1" {
				t.Errorf("headers %v", r.Headers)
			}
			got, err := Decode(r)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, c.occ) {
				t.Errorf("decoded %v, want %v", got, c.occ)
			}
		})
	}
}

func TestDecodeRefusesForeignRecords(t *testing.T) {
	for _, r := range []*kgo.Record{
		{Value: []byte(`{"a":1}`), Headers: []kgo.RecordHeader{{Key: HeaderContentType, Value: []byte("application/json")}}},
		{Value: []byte{0xff, 0xff, 0xff}, Headers: []kgo.RecordHeader{{Key: HeaderContentType, Value: []byte("application/protobuf")}}},
		{Value: nil},
	} {
		if _, err := Decode(r); !errors.Is(err, ErrNotOccurrence) {
			t.Errorf("Decode(%v) = %v, want ErrNotOccurrence", r, err)
		}
	}
}

// TestEncodeRepairsInvalidUTF8: a message with bytes that are not UTF-8
// (untrusted cluster input) is encoded with U+FFFD in place of each invalid run, not
// refused; the caller's occurrence is left as it was.
func TestEncodeRepairsInvalidUTF8(t *testing.T) {
	o := &eventpipev1.Occurrence{EventId: "c1/1/1", Cluster: "c1", Message: "pull \xff\xfe failed", Sandbox: &eventpipev1.Sandbox{Id: "sbx-\xc3"}}
	r, err := Encode(o, "events")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetMessage() != "pull \uFFFD failed" || got.GetSandbox().GetId() != "sbx-\uFFFD" {
		t.Errorf("decoded message %q, sandbox %q", got.GetMessage(), got.GetSandbox().GetId())
	}
	if string(r.Key) != "sbx-\uFFFD" {
		t.Errorf("key %q", r.Key)
	}
	if o.GetMessage() != "pull \xff\xfe failed" {
		t.Error("Encode changed the caller's occurrence")
	}
}

// BenchmarkEncode: one realistic attributed occurrence (valid UTF-8, the
// usual case) to its backbone record.
func BenchmarkEncode(b *testing.B) {
	o := &eventpipev1.Occurrence{
		EventId: "prod-eu-1/3f2a9c1e-7b7d-4c55-9a43-0d1f2e3a4b5c/12", Cluster: "prod-eu-1", Namespace: "openshell",
		OccurredAt: timestamppb.Now(), ObservedAt: timestamppb.Now(), Type: "Warning", Reason: "Failed", Count: 4,
		Message:            `Failed to pull image "ghcr.io/nvidia/openshell/supervisor:0.0.0": rpc error: code = NotFound desc = failed to pull and unpack image "ghcr.io/nvidia/openshell/supervisor:0.0.0": failed to resolve reference "ghcr.io/nvidia/openshell/supervisor:0.0.0": ghcr.io/nvidia/openshell/supervisor:0.0.0: not found`,
		ReportingComponent: "kubelet", ReportingInstance: "node-7",
		InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "openshell", Name: "os-supervisor-3f2a", Uid: "0d1f2e3a", FieldPath: "spec.containers{supervisor}"},
		Sandbox:        &eventpipev1.Sandbox{Id: "3f2a9c1e", Name: "demo", Workspace: "team-a", GatewayId: "gw-1"},
		Container:      "supervisor", Image: "ghcr.io/nvidia/openshell/supervisor:0.0.0", ImageRole: "supervisor",
		PullFailure: &eventpipev1.PullFailure{Category: "not_found", Disposition: "persistent"},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(o, "events"); err != nil {
			b.Fatal(err)
		}
	}
}

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

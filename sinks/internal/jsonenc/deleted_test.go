package jsonenc

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// sandbox.deleted_at (a deletion occurrence, or a late Event of a deleted
// sandbox) is written as protojson writes it.
func TestSandboxDeletedAt(t *testing.T) {
	o := &eventpipev1.Occurrence{EventId: eventpipev1.DeletionEventIDPrefix + "u", Reason: eventpipev1.ReasonSandboxDeleted,
		Sandbox: &eventpipev1.Sandbox{Id: "old-1", Name: "web", DeletedAt: timestamppb.New(time.Date(2026, 12, 4, 21, 0, 0, 5, time.UTC))}}
	got, err := AppendProtoJSON(nil, o)
	if err != nil {
		t.Fatal(err)
	}
	want, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	g, w := asMap(t, got), asMap(t, want)
	if gd, wd := g["sandbox"].(map[string]any)["deleted_at"], w["sandbox"].(map[string]any)["deleted_at"]; gd != wd || gd == nil {
		t.Errorf("deleted_at %v, protojson %v", gd, wd)
	}
}

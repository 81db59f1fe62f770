package kafka

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// sandbox.deleted_at is in the JSON value when set, and absent otherwise.
func TestJSONSandboxDeletedAt(t *testing.T) {
	o := seedOccurrence()
	var v struct {
		Sandbox map[string]any `json:"sandbox"`
	}
	if err := json.Unmarshal(AppendJSON(nil, o), &v); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.Sandbox["deleted_at"]; ok {
		t.Errorf("deleted_at present for a live sandbox: %v", v.Sandbox)
	}
	o.Sandbox.DeletedAt = timestamppb.New(time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC))
	if err := json.Unmarshal(AppendJSON(nil, o), &v); err != nil {
		t.Fatal(err)
	}
	if got := v.Sandbox["deleted_at"]; got != "2026-12-04T21:00:00Z" {
		t.Errorf("deleted_at = %v", got)
	}
}

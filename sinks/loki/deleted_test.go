package loki

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// sandbox.deleted_at is in the log line when set, and absent otherwise.
func TestLineSandboxDeletedAt(t *testing.T) {
	at := time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC)
	o := pullFailure("old-1", 1, at)
	var v struct {
		Sandbox map[string]any `json:"sandbox"`
	}
	if err := json.Unmarshal(appendLine(nil, o, DefaultMaxMessageBytes), &v); err != nil {
		t.Fatal(err)
	}
	if _, ok := v.Sandbox["deleted_at"]; ok {
		t.Errorf("deleted_at present for a live sandbox: %v", v.Sandbox)
	}
	o.Sandbox.DeletedAt = timestamppb.New(at)
	if err := json.Unmarshal(appendLine(nil, o, DefaultMaxMessageBytes), &v); err != nil {
		t.Fatal(err)
	}
	if got := v.Sandbox["deleted_at"]; got != "2026-12-04T21:00:00Z" {
		t.Errorf("deleted_at = %v", got)
	}
}

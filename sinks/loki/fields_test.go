package loki

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// lokiMetadataFields is README.md's structured metadata list: which field
// of the occurrence each entry carries. The line carries every field.
var lokiMetadataFields = map[string]string{
	MetaEventID:      "event_id",
	MetaOccurredAt:   "occurred_at",
	MetaSandboxID:    "sandbox.id",
	MetaSandboxName:  "sandbox.name",
	MetaReason:       "reason",
	MetaPullCategory: "pull_failure.category",
	MetaBlockerCause: "blocker.cause",
	MetaContainer:    "container",
	MetaImage:        "image",
}

// TestEveryFieldReachesTheLokiEntry: every field of the schema (found by
// walking the protobuf descriptor, recursively) is in the line under its
// proto name, and the structured metadata carry the documented ones.
func TestEveryFieldReachesTheLokiEntry(t *testing.T) {
	o, leaves, err := sinktest.EveryField()
	if err != nil {
		t.Fatal(err)
	}
	line := appendLine(nil, o, DefaultMaxMessageBytes)
	d := json.NewDecoder(bytes.NewReader(line))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("line is not JSON: %s: %v", line, err)
	}
	byPath := map[string]any{}
	for _, l := range leaves {
		byPath[l.Path] = l.Value
		got, ok := sinktest.JSONAt(v, l.Path)
		if !ok || !sinktest.SameValue(l.Value, got) {
			t.Errorf("line: %s: got %v (present %v), want %v", l.Path, got, ok, l.Value)
		}
	}
	meta := map[string]string{}
	for _, p := range metadata(o, occurredAt(o), nil) {
		meta[p.name] = p.value
	}
	for name, path := range lokiMetadataFields {
		want, ok := byPath[path]
		if !ok {
			t.Errorf("structured metadata %s names %s, which the schema does not have", name, path)
			continue
		}
		if tm, isTime := want.(time.Time); isTime {
			want = tm.UTC().Format(time.RFC3339Nano)
		}
		if got, ok := meta[name]; !ok || !sinktest.SameValue(want, got) {
			t.Errorf("structured metadata %s: got %q (present %v), want %v", name, got, ok, want)
		}
	}
	if len(meta) != len(lokiMetadataFields) {
		t.Errorf("structured metadata %v, documented %v", meta, lokiMetadataFields)
	}
}

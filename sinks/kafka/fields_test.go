package kafka

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

func decodeNumbers(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return v
}

// TestEveryFieldReachesTheKafkaJSON: every field of the schema (found by
// walking the protobuf descriptor, recursively) is in the JSON value under
// its proto name, with its value.
func TestEveryFieldReachesTheKafkaJSON(t *testing.T) {
	o, leaves, err := sinktest.EveryField()
	if err != nil {
		t.Fatal(err)
	}
	v := decodeNumbers(t, AppendJSON(nil, o))
	for _, l := range leaves {
		got, ok := sinktest.JSONAt(v, l.Path)
		if !ok || !sinktest.SameValue(l.Value, got) {
			t.Errorf("%s: got %v (present %v), want %v", l.Path, got, ok, l.Value)
		}
	}
}

// ocsfPlace is where the OCSF mapping (docs/ocsf.md) puts a field: a dotted
// OCSF path, and whether the value is there as milliseconds since the epoch
// (OCSF's timestamp_t) rather than as itself.
type ocsfPlace struct {
	path   string
	millis bool
}

// ocsfFieldPlaces is docs/ocsf.md's table, field by field: the places every
// field of the occurrence always reaches. (Places that depend on the event,
// such as device.container for a kubelet event, are tested in
// TestOCSFFields.) A field missing here fails the test below: a new field
// of the schema needs a place in OCSF (unmapped at least) and a row in the
// doc.
var ocsfFieldPlaces = map[string][]ocsfPlace{
	"schema_version":              {{path: "unmapped.schema_version"}},
	"event_id":                    {{path: "metadata.uid"}, {path: "unmapped.event_id"}},
	"occurred_at":                 {{path: "time", millis: true}, {path: "metadata.original_time"}},
	"observed_at":                 {{path: "metadata.logged_time", millis: true}, {path: "unmapped.observed_at"}},
	"cluster":                     {{path: "unmapped.cluster"}},
	"namespace":                   {{path: "unmapped.namespace"}},
	"event.name":                  {{path: "unmapped.event.name"}},
	"event.uid":                   {{path: "metadata.original_event_uid"}, {path: "unmapped.event.uid"}},
	"event.resource_version":      {{path: "unmapped.event.resource_version"}},
	"event.api_version":           {{path: "unmapped.event.api_version"}},
	"involved_object.kind":        {{path: "unmapped.involved_object.kind"}},
	"involved_object.api_version": {{path: "unmapped.involved_object.api_version"}},
	"involved_object.namespace":   {{path: "unmapped.involved_object.namespace"}},
	"involved_object.name":        {{path: "unmapped.involved_object.name"}},
	"involved_object.uid":         {{path: "unmapped.involved_object.uid"}},
	"involved_object.field_path":  {{path: "unmapped.involved_object.field_path"}},
	"type":                        {{path: "unmapped.type"}},
	"reason":                      {{path: "status_code"}, {path: "metadata.event_code"}, {path: "unmapped.reason"}},
	"message":                     {{path: "message"}},
	"message_truncated":           {{path: "metadata.is_truncated"}, {path: "unmapped.message_truncated"}},
	"count":                       {{path: "count"}},
	"reporting_component":         {{path: "unmapped.reporting_component"}},
	"reporting_instance":          {{path: "unmapped.reporting_instance"}},
	"action":                      {{path: "unmapped.action"}},
	"sandbox.id":                  {{path: "app.uid"}, {path: "metadata.correlation_uid"}, {path: "unmapped.sandbox.id"}},
	"sandbox.name":                {{path: "app.name"}, {path: "unmapped.sandbox.name"}},
	"sandbox.workspace":           {{path: "unmapped.sandbox.workspace"}},
	"sandbox.gateway_id":          {{path: "unmapped.sandbox.gateway_id"}},
	"sandbox.cr_namespace":        {{path: "unmapped.sandbox.cr_namespace"}},
	"sandbox.cr_name":             {{path: "unmapped.sandbox.cr_name"}},
	"sandbox.deleted_at":          {{path: "unmapped.sandbox.deleted_at"}},
	"attribution":                 {{path: "unmapped.attribution"}},
	"role":                        {{path: "unmapped.role"}},
	"container":                   {{path: "unmapped.container"}},
	"image":                       {{path: "unmapped.image"}},
	"image_role":                  {{path: "unmapped.image_role"}},
	"pull_failure.category":       {{path: "unmapped.pull_failure.category"}},
	"pull_failure.image":          {{path: "unmapped.pull_failure.image"}},
	"pull_failure.disposition":    {{path: "unmapped.pull_failure.disposition"}},
	"pull_failure.attempts":       {{path: "unmapped.pull_failure.attempts"}},
	"pull_failure.first_seen":     {{path: "unmapped.pull_failure.first_seen"}},
	"pull_failure.last_seen":      {{path: "unmapped.pull_failure.last_seen"}},
	"pull_failure.detail":         {{path: "unmapped.pull_failure.detail"}},
	"pull_failure.source":         {{path: "unmapped.pull_failure.source"}},
	"pull_failure.decided_by":     {{path: "unmapped.pull_failure.decided_by"}},
	"pull_failure.confidence":     {{path: "unmapped.pull_failure.confidence"}},
	"progress.complete_step":      {{path: "unmapped.progress.complete_step"}},
	"progress.complete_label":     {{path: "unmapped.progress.complete_label"}},
	"progress.active_step":        {{path: "unmapped.progress.active_step"}},
	"progress.active_detail":      {{path: "unmapped.progress.active_detail"}},
	"blocker.kind":                {{path: "unmapped.blocker.kind"}},
	"blocker.cause":               {{path: "unmapped.blocker.cause"}},
	"blocker.object":              {{path: "unmapped.blocker.object"}},
	"blocker.container":           {{path: "unmapped.blocker.container"}},
	"blocker.disposition":         {{path: "unmapped.blocker.disposition"}},
	"blocker.attempts":            {{path: "unmapped.blocker.attempts"}},
	"blocker.first_seen":          {{path: "unmapped.blocker.first_seen"}},
	"blocker.last_seen":           {{path: "unmapped.blocker.last_seen"}},
	"blocker.detail":              {{path: "unmapped.blocker.detail"}},
	"blocker.source":              {{path: "unmapped.blocker.source"}},
	"blocker.fix":                 {{path: "unmapped.blocker.fix"}},
	"blocker.exit_code":           {{path: "unmapped.blocker.exit_code"}},
	"blocker.has_exit_code":       {{path: "unmapped.blocker.has_exit_code"}},
	"blocker.decided_by":          {{path: "unmapped.blocker.decided_by"}},
	"blocker.confidence":          {{path: "unmapped.blocker.confidence"}},
}

// TestEveryFieldReachesOCSF: every field of the schema (found by walking the
// protobuf descriptor) is in the OCSF event where docs/ocsf.md says, with
// its value; a field with no place in the table fails.
func TestEveryFieldReachesOCSF(t *testing.T) {
	o, leaves, err := sinktest.EveryField()
	if err != nil {
		t.Fatal(err)
	}
	b, err := AppendOCSF(nil, o)
	if err != nil {
		t.Fatal(err)
	}
	v := decodeNumbers(t, b)
	seen := map[string]bool{}
	for _, l := range leaves {
		seen[l.Path] = true
		places, ok := ocsfFieldPlaces[l.Path]
		if !ok {
			t.Errorf("%s has no place in the OCSF mapping: carry it (unmapped at least), add it to ocsfFieldPlaces and docs/ocsf.md", l.Path)
			continue
		}
		for _, p := range places {
			want := l.Value
			if tm, ok := want.(time.Time); ok && p.millis {
				want = tm.UnixMilli()
			}
			got, ok := sinktest.JSONAt(v, p.path)
			if !ok || !sinktest.SameValue(want, got) {
				t.Errorf("%s -> %s: got %v (present %v), want %v", l.Path, p.path, got, ok, want)
			}
		}
	}
	for path := range ocsfFieldPlaces {
		if !seen[path] {
			t.Errorf("ocsfFieldPlaces names %s, which the schema does not have", path)
		}
	}
	if t.Failed() {
		t.Logf("event: %s", b)
	}
}

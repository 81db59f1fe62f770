package jsonenc

import (
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// FuzzAppendProtoJSON: for any strings, numbers and times, the output is
// valid JSON and, where protojson accepts the input, says the same.
func FuzzAppendProtoJSON(f *testing.F) {
	f.Add("Back-off pulling image \"x\"", "2ff21e26-1a7b-49a2-a640-14ae153f93ea", int32(3), int64(1793268652), int32(42_000_000))
	f.Add("x\"}\n{job=\"evil\"}", "\u2028\x00", int32(-1), int64(0), int32(0))
	f.Add("bad\xff\xfe", "n\xc3(", int32(0), int64(-62135596800), int32(999_999_999))
	f.Fuzz(func(t *testing.T, msg, name string, count int32, secs int64, nanos int32) {
		o := &eventpipev1.Occurrence{
			EventId: name, Message: msg, Count: count,
			OccurredAt: &timestamppb.Timestamp{Seconds: secs, Nanos: nanos},
			Sandbox:    &eventpipev1.Sandbox{Name: name, Id: msg},
		}
		got, err := AppendProtoJSON(nil, o)
		if !json.Valid(got) {
			t.Fatalf("invalid JSON: %q", got)
		}
		want, perr := protojson.MarshalOptions{UseProtoNames: true}.Marshal(o)
		if perr != nil {
			if utf8.ValidString(msg) && utf8.ValidString(name) && err == nil {
				t.Fatalf("protojson refused (%v) what jsonenc accepted", perr)
			}
			return
		}
		if err != nil {
			t.Fatalf("jsonenc refused (%v) what protojson accepted", err)
		}
		var a, b map[string]any
		_ = json.Unmarshal(got, &a)
		_ = json.Unmarshal(want, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("differs:\n got %s\nwant %s", got, want)
		}
	})
}

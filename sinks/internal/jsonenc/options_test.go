package jsonenc

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestOptions: the caps cut on a rune boundary and mark a cut message,
// OmitBadTimes leaves out what protojson writes as 1970 or refuses, and the
// zero Options are protojson's form.
func TestOptions(t *testing.T) {
	e := strings.Repeat("é", 10) // 20 bytes of 2-byte runes
	type want struct {
		Reason     *string        `json:"reason"`
		Message    *string        `json:"message"`
		Truncated  bool           `json:"message_truncated"`
		OccurredAt *string        `json:"occurred_at"`
		ObservedAt *string        `json:"observed_at"`
		Sandbox    map[string]any `json:"sandbox"`
	}
	cases := []struct {
		name    string
		opt     Options
		o       *eventpipev1.Occurrence
		wantErr bool
		check   func(t *testing.T, w want)
	}{
		{"message cut on a rune boundary and marked", Options{MaxMessageBytes: 7}, &eventpipev1.Occurrence{Message: e}, false,
			func(t *testing.T, w want) {
				if w.Message == nil || *w.Message != "ééé" || !w.Truncated {
					t.Errorf("message %v truncated %v, want ééé true", w.Message, w.Truncated)
				}
			}},
		{"message at the cap is kept whole", Options{MaxMessageBytes: 20}, &eventpipev1.Occurrence{Message: e}, false,
			func(t *testing.T, w want) {
				if w.Message == nil || *w.Message != e || w.Truncated {
					t.Errorf("message %v truncated %v", w.Message, w.Truncated)
				}
			}},
		{"truncated flag kept when not cut here", Options{MaxMessageBytes: 100}, &eventpipev1.Occurrence{Message: "m", MessageTruncated: true}, false,
			func(t *testing.T, w want) {
				if !w.Truncated {
					t.Error("message_truncated lost")
				}
			}},
		{"other strings capped, message not", Options{MaxStringBytes: 5}, &eventpipev1.Occurrence{Reason: e, Message: e,
			Sandbox: &eventpipev1.Sandbox{Name: e}}, false,
			func(t *testing.T, w want) {
				if w.Reason == nil || *w.Reason != "éé" || w.Sandbox["name"] != "éé" {
					t.Errorf("reason %v sandbox.name %v, want éé", w.Reason, w.Sandbox["name"])
				}
				if *w.Message != e || w.Truncated {
					t.Errorf("message %q cut by the string cap", *w.Message)
				}
			}},
		{"zero and out-of-range times omitted", Options{OmitBadTimes: true}, &eventpipev1.Occurrence{
			OccurredAt: &timestamppb.Timestamp{}, ObservedAt: &timestamppb.Timestamp{Seconds: maxSeconds + 1},
			Sandbox: &eventpipev1.Sandbox{Id: "s", DeletedAt: &timestamppb.Timestamp{Nanos: -1}}}, false,
			func(t *testing.T, w want) {
				if w.OccurredAt != nil || w.ObservedAt != nil || w.Sandbox["deleted_at"] != nil {
					t.Errorf("bad times written: %v %v %v", w.OccurredAt, w.ObservedAt, w.Sandbox["deleted_at"])
				}
			}},
		{"zero time written by default", Options{}, &eventpipev1.Occurrence{OccurredAt: &timestamppb.Timestamp{}}, false,
			func(t *testing.T, w want) {
				if w.OccurredAt == nil || *w.OccurredAt != "1970-01-01T00:00:00Z" {
					t.Errorf("occurred_at %v", w.OccurredAt)
				}
			}},
		{"out-of-range time fails by default", Options{}, &eventpipev1.Occurrence{ObservedAt: &timestamppb.Timestamp{Seconds: maxSeconds + 1}}, true, nil},
		{"no caps by default", Options{}, &eventpipev1.Occurrence{Reason: e, Message: e}, false,
			func(t *testing.T, w want) {
				if *w.Reason != e || *w.Message != e || w.Truncated {
					t.Errorf("cut without a cap: %v %v", *w.Reason, *w.Message)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := AppendOccurrence(nil, c.o, c.opt)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error %v", err, c.wantErr)
			}
			if c.wantErr {
				return
			}
			if !json.Valid(b) || !utf8.Valid(b) {
				t.Fatalf("invalid line %q", b)
			}
			var w want
			if err := json.Unmarshal(b, &w); err != nil {
				t.Fatal(err)
			}
			c.check(t, w)
		})
	}
}

func TestCutUTF8(t *testing.T) {
	cases := []struct {
		in   string
		max  int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 3, "abc"},
		{"abc", 2, "ab"},
		{"é", 1, ""},
		{"aé", 2, "a"},
		{"a€b", 3, "a"},
		{"a€b", 4, "a€"},
		{"😀😀", 7, "😀"},
		{"x", 0, ""},
	}
	for _, c := range cases {
		if got := CutUTF8(c.in, c.max); got != c.want {
			t.Errorf("CutUTF8(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

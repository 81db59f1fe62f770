package jsonenc

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/sanitize"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

func asMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return m
}

func cases() []*eventpipev1.Occurrence {
	occs := sinktest.NewGenerator(3, "je-").Batch(2000)
	for _, h := range sinktest.Hostile("je-h-") {
		occs = append(occs, sanitize.ValidUTF8(h))
	}
	base := time.Date(2026, 10, 29, 10, 10, 52, 0, time.UTC)
	for _, n := range []int{0, 1, 120_000_000, 123_456_000, 123_456_789, 999_999_999} {
		occs = append(occs, &eventpipev1.Occurrence{EventId: "t", OccurredAt: timestamppb.New(base.Add(time.Duration(n)))})
	}
	occs = append(occs,
		&eventpipev1.Occurrence{},
		&eventpipev1.Occurrence{Sandbox: &eventpipev1.Sandbox{}, Event: &eventpipev1.EventRef{}, PullFailure: &eventpipev1.PullFailure{}, Progress: &eventpipev1.Progress{}},
		&eventpipev1.Occurrence{Count: -3, MessageTruncated: true, Message: "\u2028<&>\x00\x7f"},
		&eventpipev1.Occurrence{OccurredAt: timestamppb.New(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC))},
	)
	return occs
}

// The fast encoder says exactly what protojson says.
func TestAppendProtoJSONMatchesProtojson(t *testing.T) {
	opts := protojson.MarshalOptions{UseProtoNames: true}
	for i, o := range cases() {
		want, err := opts.Marshal(o)
		if err != nil {
			t.Fatalf("case %d: protojson: %v", i, err)
		}
		got, err := AppendProtoJSON(nil, o)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !reflect.DeepEqual(asMap(t, got), asMap(t, want)) {
			t.Fatalf("case %d differs:\n got %s\nwant %s", i, got, want)
		}
		var back eventpipev1.Occurrence
		if err := protojson.Unmarshal(got, &back); err != nil || !proto.Equal(&back, o) {
			t.Fatalf("case %d does not round-trip (%v)", i, err)
		}
	}
}

func TestInvalidInput(t *testing.T) {
	o := &eventpipev1.Occurrence{Message: "bad\xff(", OccurredAt: &timestamppb.Timestamp{Seconds: maxSeconds + 1}}
	b, err := AppendProtoJSON(nil, o)
	if err == nil {
		t.Error("out-of-range timestamp accepted")
	}
	if !json.Valid(b) {
		t.Errorf("invalid JSON even on error: %s", b)
	}
	o.OccurredAt = nil
	b, err = AppendProtoJSON(nil, o)
	if err != nil || !strings.Contains(string(b), `bad\ufffd(`) {
		t.Errorf("invalid UTF-8: %s %v", b, err)
	}
}

// AppendString agrees with encoding/json on every string, valid or not.
func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Back-off pulling image ", "0123456789abcdef", "\"", "\\", "\n", "\r", "\t", "\x00", "\x1f", "}", "é", "日本", "\u2028", "\u2029", "<", "&", "\xff", "\xc3"}
	for i := 0; i < 5000; i++ {
		var sb strings.Builder
		for j := rng.IntN(20); j > 0; j-- {
			sb.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		s := sb.String()
		got := AppendString(nil, s)
		var back, want string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, got, err)
		}
		ref, _ := json.Marshal(s)
		_ = json.Unmarshal(ref, &want)
		if back != want || !utf8.ValidString(back) {
			t.Fatalf("%q: got %q, encoding/json %q", s, back, want)
		}
	}
}

// The word-at-a-time scan sees every byte value at every position of a
// word, and across word boundaries.
func TestAppendStringEveryByteEverywhere(t *testing.T) {
	for c := 0; c < 256; c++ {
		for pos := 0; pos < 19; pos++ {
			b := []byte("abcdefghijklmnopqrs")
			b[pos] = byte(c)
			s := string(b)
			got := AppendString(nil, s)
			ref, _ := json.Marshal(s)
			var back, want string
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatalf("%q -> %s: %v", s, got, err)
			}
			_ = json.Unmarshal(ref, &want)
			if back != want {
				t.Fatalf("%q: got %q, encoding/json %q", s, back, want)
			}
		}
	}
}

func BenchmarkAppendProtoJSON(b *testing.B) {
	occs := sinktest.NewGenerator(4, "jb-").Batch(1024)
	buf := make([]byte, 0, 4096)
	b.Run("jsonenc", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			buf, _ = AppendProtoJSON(buf[:0], occs[i%len(occs)])
		}
	})
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		opts := protojson.MarshalOptions{UseProtoNames: true}
		for i := 0; b.Loop(); i++ {
			buf, _ = opts.MarshalAppend(buf[:0], occs[i%len(occs)])
		}
	})
}

package file

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// eventIDs are the occurrences' event_ids, in order.
func eventIDs(occs []*eventpipev1.Occurrence) []string {
	out := make([]string, 0, len(occs))
	for _, o := range occs {
		out = append(out, o.GetEventId())
	}
	return out
}

// TestRestartDoesNotAppendWhatItWrote: a sink opened on files an earlier
// process wrote (stopped cleanly, or killed in the middle of a write) skips
// the records a runner pushes again, by event_id, as far back as
// resend_window lines, across rotated files; a torn last line is cut and
// counted, and its record written again whole. The last case shows the
// bound: a resend reaching further back than the window is written twice.
func TestRestartDoesNotAppendWhatItWrote(t *testing.T) {
	gen := sinktest.NewGenerator(23, "resend-")
	a, b := gen.Batch(30), gen.Batch(10)
	cases := []struct {
		name     string
		maxBytes int64
		window   int
		// before the restart: what the earlier process wrote, and the
		// bytes of a torn line it left (a record of resend cut in half)
		torn bool
		// after: what the runner pushes again and then new
		resend       []*eventpipev1.Occurrence
		want         []*eventpipev1.Occurrence
		wantRepeated float64
		wantTorn     float64
	}{
		{name: "clean restart, resend from an older cursor", window: DefaultResendWindow,
			resend: a[10:], want: slices.Concat(a, b), wantRepeated: 20},
		{name: "killed mid-write: the torn line is cut and written again", window: DefaultResendWindow, torn: true,
			resend: a[25:], want: slices.Concat(a, b), wantRepeated: 5, wantTorn: 1},
		{name: "the window spans rotated files", window: DefaultResendWindow, maxBytes: MinMaxBytes,
			resend: a, want: slices.Concat(a, b), wantRepeated: 30},
		{name: "a resend older than the window is written again", window: 5,
			resend: a[20:], want: slices.Concat(a, a[20:25], b), wantRepeated: 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := NewDefaultConfig()
			cfg.Path = filepath.Join(t.TempDir(), "events.jsonl")
			cfg.ResendWindow = c.window
			cfg.MaxFiles = 100
			if c.maxBytes > 0 {
				cfg.MaxBytes = c.maxBytes
			}
			first, err := New(cfg, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(a); i += 7 {
				if err := push(t, first, a[i:min(i+7, len(a))]); err != nil {
					t.Fatal(err)
				}
			}
			first.Close()
			if c.torn {
				line, err := jsonenc.AppendProtoJSON(nil, b[0])
				if err != nil {
					t.Fatal(err)
				}
				f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Write(line[:len(line)/2])
				f.Close()
			}

			reg := prometheus.NewRegistry()
			second, err := New(cfg, nil, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer second.Close()
			if err := push(t, second, c.resend); err != nil {
				t.Fatal(err)
			}
			if err := push(t, second, b); err != nil {
				t.Fatal(err)
			}
			got, err := readIDs(t, second)
			if err != nil {
				t.Fatal(err)
			}
			if want := eventIDs(c.want); !slices.Equal(got, want) {
				t.Errorf("file holds %d lines %v\nwant %d %v", len(got), got, len(want), want)
			}
			if n := testutil.ToFloat64(second.m.repeats); n != c.wantRepeated {
				t.Errorf("repeated records counted %v, want %v", n, c.wantRepeated)
			}
			if n := testutil.ToFloat64(second.m.torn); n != c.wantTorn {
				t.Errorf("torn lines counted %v, want %v", n, c.wantTorn)
			}
		})
	}
}

// TestRepeatWithinOneProcess: a batch pushed again by the same sink (a
// Kafka-mode partition that came back to this replica before its commit,
// a push the runner abandoned after the write) is not written twice, and a
// record repeated inside one batch is written once.
func TestRepeatWithinOneProcess(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "events.jsonl")
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	occs := sinktest.NewGenerator(5, "again-").Batch(4)
	for _, batch := range [][]*eventpipev1.Occurrence{occs[:2], occs, {occs[3], occs[3]}} {
		if err := push(t, s, batch); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readIDs(t, s)
	if err != nil {
		t.Fatal(err)
	}
	if want := eventIDs(occs); !slices.Equal(got, want) {
		t.Errorf("file holds %v, want %v", got, want)
	}
}

func TestLineEventID(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{"schema_version":1,"event_id":"uid-1/42","occurred_at":"2026-10-29T10:10:40Z"}` + "\n", "uid-1/42"},
		{`{"event_id":"nouid/ns/name/7","message":"x"}` + "\n", "nouid/ns/name/7"},
		{`{"schema_version":1,"event_id":"a\"b/1"}` + "\n", `a"b/1`},                       // escaped: decoded whole
		{`{"schema_version":1,"reason":"x","message":"\"event_id\":\"fake\""}` + "\n", ""}, // no event_id
		{`{"message":"x","event_id":"late/1"}` + "\n", "late/1"},                           // another order
		{"not json\n", ""},
	} {
		if got := lineEventID([]byte(c.line)); got != c.want {
			t.Errorf("lineEventID(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}

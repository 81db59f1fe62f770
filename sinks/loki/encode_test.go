package loki

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

var update = flag.Bool("update", false, "rewrite golden files")

var t0 = time.Date(2026, 10, 29, 10, 10, 40, 123456789, time.UTC)

// TestLineGolden pins the line format: field order and omissions are part
// of the contract (README.md).
func TestLineGolden(t *testing.T) {
	cases := map[string]*eventpipev1.Occurrence{
		"pull_failure": pullFailure("2ff21e26-1a7b-49a2-a640-14ae153f93ea", 1, t0),
		"scheduled":    scheduled(2, t0),
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			got := appendLine(nil, o, DefaultMaxMessageBytes)
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
			var pretty bytes.Buffer
			_ = json.Indent(&pretty, got, "", "  ")
			path := filepath.Join("testdata", "line_"+name+".golden.json")
			if *update {
				if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if string(got) != strings.TrimSuffix(string(want), "\n") {
				t.Fatalf("line changed:\ngot  %s\nwant %s", got, want)
			}
		})
	}
}

// TestLineDeterministic: the same occurrence, even decoded from its wire
// form into a new message, always gives the same bytes.
func TestLineDeterministic(t *testing.T) {
	o := pullFailure("2ff21e26-1a7b-49a2-a640-14ae153f93ea", 3, t0)
	first := appendLine(nil, o, DefaultMaxMessageBytes)
	for i := 0; i < 20; i++ {
		b, err := proto.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var c eventpipev1.Occurrence
		if err := proto.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		if got := appendLine(make([]byte, 0, i), &c, DefaultMaxMessageBytes); !bytes.Equal(got, first) {
			t.Fatalf("run %d: %s\n!= %s", i, got, first)
		}
	}
}

func hostile(o *eventpipev1.Occurrence) *eventpipev1.Occurrence {
	evil := "x\"}, {job=\"pwned\"} \\ \n\r\t\x00\x7f \xff\xfe end\u2028"
	o.EventId += evil
	o.Cluster = evil
	o.Namespace = evil
	o.Type = evil
	o.Reason = evil
	o.Message = evil
	o.ReportingComponent = evil
	o.Container = evil
	o.Image = evil
	o.Sandbox.Id = evil
	o.Sandbox.Name = evil
	o.Sandbox.Workspace = evil
	o.PullFailure.Category = evil
	o.InvolvedObject.Name = evil
	return o
}

func TestLineHostileInput(t *testing.T) {
	o := hostile(pullFailure("s", 1, t0))
	line := appendLine(nil, o, DefaultMaxMessageBytes)
	if !json.Valid(line) || !utf8.Valid(line) {
		t.Fatalf("invalid line: %q", line)
	}
	if bytes.ContainsAny(line, "\n\r\x00") {
		t.Fatalf("raw control characters in line: %q", line)
	}
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatal(err)
	}
	if got := m["reason"].(string); !strings.Contains(got, `"}, {job="pwned"}`) || !strings.Contains(got, "\uFFFD") {
		t.Fatalf("reason not kept (escaped) with invalid bytes replaced: %q", got)
	}
}

func TestLineTruncatesMessage(t *testing.T) {
	o := scheduled(1, t0)
	o.Message = strings.Repeat("é", 1<<20/2) + "tail" // 1 MiB of 2-byte runes
	line := appendLine(nil, o, 1000)
	var m struct {
		Message   string `json:"message"`
		Truncated bool   `json:"message_truncated"`
	}
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatal(err)
	}
	if !m.Truncated || len(m.Message) != 1000 || !utf8.ValidString(m.Message) {
		t.Fatalf("truncated=%v len=%d valid=%v", m.Truncated, len(m.Message), utf8.ValidString(m.Message))
	}
	// Every other field is capped too.
	o.Message = "short"
	o.Reason = strings.Repeat("r", 100_000)
	if line := appendLine(nil, o, 1000); len(line) > maxFieldBytes+1000 {
		t.Fatalf("line %d bytes: reason not capped", len(line))
	}
}

func TestSanitizeValue(t *testing.T) {
	cases := []struct{ in, want string }{
		{"kubelet", "kubelet"},
		{"a\"}, {job=\"x\"}", "a\"}, {job=\"x\"}"}, // kept, escaped by labelString
		{"line\nbreak\r\ttab", "line break  tab"},
		{"bad\xffutf8", "bad\uFFFDutf8"},
		{"  padded  ", "padded"},
		{"\x00\x01", ""},
		{strings.Repeat("ü", 100), strings.Repeat("ü", 64)}, // 128 bytes, no split rune
		{strings.Repeat("a", 127) + "ü", strings.Repeat("a", 127)},
		{"ends\u2028here", "ends here"},
	}
	for _, c := range cases {
		if got := sanitizeValue(c.in, 128); got != c.want {
			t.Errorf("sanitizeValue(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// parseSelector is a strict parser of {a="x", b="y"} (the Prometheus label
// syntax Loki uses), to show labelString round-trips.
func parseSelector(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		t.Fatalf("selector %q", s)
	}
	s = s[1 : len(s)-1]
	for s != "" {
		eq := strings.Index(s, `="`)
		if eq < 0 {
			t.Fatalf("no =\" in %q", s)
		}
		name := s[:eq]
		s = s[eq+2:]
		var v strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' {
				i++
			}
			if s[i] == '\n' {
				t.Fatalf("raw newline in selector")
			}
			v.WriteByte(s[i])
		}
		if i >= len(s) {
			t.Fatalf("unterminated value")
		}
		out[name] = v.String()
		s = strings.TrimPrefix(s[i+1:], ", ")
	}
	return out
}

func TestLabelsHostileInputKeepLabelSet(t *testing.T) {
	l := newLabeler(NewDefaultConfig().Labels)
	o := hostile(pullFailure("s", 1, t0))
	pairs := l.labels(o, nil)
	sel := labelString(pairs)
	got := parseSelector(t, sel)
	wantNames := []string{"cluster", "job", "namespace", "source", "type", "workspace"}
	if len(got) != len(wantNames) {
		t.Fatalf("labels %v from %s", got, sel)
	}
	for _, n := range wantNames {
		if _, ok := got[n]; !ok {
			t.Fatalf("label %s missing from %s", n, sel)
		}
	}
	if got["job"] != "eventpipe" {
		t.Fatalf("job overridden: %q", got["job"])
	}
	for _, p := range pairs {
		if got[p.name] != p.value {
			t.Fatalf("%s: round-trip %q != %q", p.name, got[p.name], p.value)
		}
	}
}

func TestLabelsUnattributedOmitEmpty(t *testing.T) {
	l := newLabeler(NewDefaultConfig().Labels)
	got := labelString(l.labels(scheduled(1, t0), nil))
	want := `{cluster="kind-osrepro", job="eventpipe", namespace="default", source="default-scheduler", type="Normal"}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestMetadata(t *testing.T) {
	o := pullFailure("2ff21e26-1a7b-49a2-a640-14ae153f93ea", 1, t0)
	got := metadata(o, t0, nil)
	want := []labelPair{
		{MetaEventID, o.EventId},
		{MetaOccurredAt, "2026-10-29T10:10:40.123456789Z"},
		{MetaSandboxID, "2ff21e26-1a7b-49a2-a640-14ae153f93ea"},
		{MetaSandboxName, "img-missing"},
		{MetaReason, "Failed"},
		{MetaPullCategory, "not_found"},
		{MetaContainer, "workspace-init"},
		{MetaImage, "docker.io/library/busybox:0.0.0-does-not-exist"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	if n := len(metadata(scheduled(1, t0), t0, nil)); n != 3 { // event_id, occurred_at, reason
		t.Errorf("unattributed: %d metadata pairs, want 3", n)
	}
}

// TestMetadataTimeAsInTheLine: the occurred_at metadata is written as the
// line writes occurred_at (jsonenc: 0, 3, 6 or 9 fractional digits), so a
// query can match one against the other; time.RFC3339Nano wrote ".5Z" for
// the line's ".500Z".
func TestMetadataTimeAsInTheLine(t *testing.T) {
	for _, c := range []struct {
		nanos int
		want  string
	}{
		{0, "2026-10-29T10:10:40Z"},
		{500_000_000, "2026-10-29T10:10:40.500Z"},
		{120_000, "2026-10-29T10:10:40.000120Z"},
		{123_456_780, "2026-10-29T10:10:40.123456780Z"},
	} {
		at := time.Date(2026, 10, 29, 10, 10, 40, c.nanos, time.UTC)
		o := pullFailure("2ff21e26-1a7b-49a2-a640-14ae153f93ea", 1, at)
		var got string
		for _, p := range metadata(o, occurredAt(o), nil) {
			if p.name == MetaOccurredAt {
				got = p.value
			}
		}
		line := string(appendLine(nil, o, NewDefaultConfig().MaxMessageBytes))
		if got != c.want || !strings.Contains(line, `"occurred_at":"`+got+`"`) {
			t.Errorf("%d ns: metadata %q, want %q as in the line", c.nanos, got, c.want)
		}
	}
}

type decodedEntry struct {
	sec, nanos int64
	line       string
	meta       [][2]string
}
type decodedStream struct {
	labels  string
	entries []decodedEntry
}

type fieldFunc func(num protowire.Number, v []byte, x uint64) error

func fields(b []byte, fn fieldFunc) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("bad tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("bad bytes: %w", protowire.ParseError(n))
			}
			if err := fn(num, v, 0); err != nil {
				return err
			}
			b = b[n:]
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return fmt.Errorf("bad varint: %w", protowire.ParseError(n))
			}
			if err := fn(num, nil, v); err != nil {
				return err
			}
			b = b[n:]
		default:
			return fmt.Errorf("unexpected wire type %v", typ)
		}
	}
	return nil
}

// decodePushBytes decodes a PushRequest with protowire, independently of
// the size arithmetic of the encoder.
func decodePushBytes(b []byte) ([]decodedStream, error) {
	var out []decodedStream
	err := fields(b, func(num protowire.Number, v []byte, _ uint64) error {
		if num != 1 {
			return fmt.Errorf("PushRequest field %d", num)
		}
		var s decodedStream
		err := fields(v, func(num protowire.Number, v []byte, _ uint64) error {
			switch num {
			case 1:
				s.labels = string(v)
			case 2:
				var e decodedEntry
				err := fields(v, func(num protowire.Number, v []byte, _ uint64) error {
					switch num {
					case 1:
						return fields(v, func(num protowire.Number, _ []byte, x uint64) error {
							if num == 1 {
								e.sec = int64(x)
							} else {
								e.nanos = int64(x)
							}
							return nil
						})
					case 2:
						e.line = string(v)
					case 3:
						var p [2]string
						err := fields(v, func(num protowire.Number, v []byte, _ uint64) error {
							if num < 1 || num > 2 {
								return fmt.Errorf("LabelPairAdapter field %d", num)
							}
							p[num-1] = string(v)
							return nil
						})
						e.meta = append(e.meta, p)
						return err
					default:
						return fmt.Errorf("EntryAdapter field %d", num)
					}
					return nil
				})
				s.entries = append(s.entries, e)
				return err
			default:
				return fmt.Errorf("StreamAdapter field %d", num)
			}
			return nil
		})
		out = append(out, s)
		return err
	})
	return out, err
}

func decodePush(t *testing.T, b []byte) []decodedStream {
	t.Helper()
	out, err := decodePushBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestProtoRoundTripGroupsAndSorts(t *testing.T) {
	mk := func(idx int, stream string, ts time.Time, line string) *entry {
		return &entry{idx: idx, stream: stream, ts: ts, line: []byte(line), meta: []labelPair{{"event_id", line}}}
	}
	es := []*entry{
		mk(0, `{job="a"}`, t0.Add(2*time.Second), "a2"),
		mk(1, `{job="b"}`, t0, "b0"),
		mk(2, `{job="a"}`, t0, "a0"),
		mk(3, `{job="a"}`, t0.Add(2*time.Second), "a2bis"),
		mk(4, `{job="a"}`, time.Unix(0, 0), "epoch"),
	}
	got := decodePush(t, appendPushProto(nil, groupStreams(es)))
	if len(got) != 2 || got[0].labels != `{job="a"}` || got[1].labels != `{job="b"}` {
		t.Fatalf("streams %+v", got)
	}
	var lines []string
	for _, e := range got[0].entries {
		lines = append(lines, e.line)
		if e.meta[0] != [2]string{"event_id", e.line} {
			t.Fatalf("meta %v", e.meta)
		}
	}
	if strings.Join(lines, ",") != "epoch,a0,a2,a2bis" {
		t.Fatalf("order %v", lines)
	}
	if e := got[0].entries[1]; e.sec != t0.Unix() || e.nanos != int64(t0.Nanosecond()) {
		t.Fatalf("timestamp %d.%d", e.sec, e.nanos)
	}
}

func TestJSONPushBody(t *testing.T) {
	es := []*entry{{stream: `{job="a"}`, labels: []labelPair{{"job", "a\"}"}}, ts: t0, line: []byte(`{"event_id":"e\n"}`), meta: []labelPair{{"event_id", "e\n"}}}}
	body := appendPushJSON(nil, groupStreams(es))
	var req struct {
		Streams []struct {
			Stream map[string]string `json:"stream"`
			Values [][]any           `json:"values"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	s := req.Streams[0]
	if s.Stream["job"] != "a\"}" || s.Values[0][0] != strconv.FormatInt(t0.UnixNano(), 10) || s.Values[0][1] != `{"event_id":"e\n"}` {
		t.Fatalf("decoded %+v", req)
	}
	if s.Values[0][2].(map[string]any)["event_id"] != "e\n" {
		t.Fatalf("meta %v", s.Values[0][2])
	}
}

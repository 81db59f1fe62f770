package loki

import (
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
)

// maxFieldBytes caps every string in the line other than the message, and
// maxMetaBytes every structured-metadata value: Kubernetes names, UIDs and
// image references are far shorter, so only hostile input is cut.
const (
	maxFieldBytes = 4096
	maxMetaBytes  = 1024
)

// Structured metadata names, in the order they are sent.
const (
	MetaEventID      = "event_id"
	MetaOccurredAt   = "occurred_at"
	MetaSandboxID    = "sandbox_id"
	MetaSandboxName  = "sandbox_name"
	MetaReason       = "reason"
	MetaPullCategory = "pull_category"
	MetaBlockerCause = "blocker_cause"
	MetaContainer    = "container"
	MetaImage        = "image"
)

type labelPair struct{ name, value string }

// labeler turns an occurrence into its stream label set. Names are fixed at
// construction; values are sanitised, so no field content can add, remove or
// rename a label.
type labeler struct {
	static   []labelPair // sorted by name
	fields   []string    // sorted
	maxValue int
}

func newLabeler(c LabelsConfig) *labeler {
	l := &labeler{maxValue: c.MaxValueBytes}
	if c.Job != "" {
		l.static = append(l.static, labelPair{"job", c.Job})
	}
	for _, k := range sortedKeys(c.Static) {
		l.static = append(l.static, labelPair{k, c.Static[k]})
	}
	slices.SortFunc(l.static, func(a, b labelPair) int { return strings.Compare(a.name, b.name) })
	l.fields = slices.Clone(c.Fields)
	slices.Sort(l.fields)
	return l
}

func fieldValue(o *eventpipev1.Occurrence, f string) string {
	switch f {
	case FieldCluster:
		return o.GetCluster()
	case FieldNamespace:
		return o.GetNamespace()
	case FieldWorkspace:
		return o.GetSandbox().GetWorkspace()
	case FieldGatewayID:
		return o.GetSandbox().GetGatewayId()
	case FieldType:
		return o.GetType()
	case FieldSource:
		return o.GetReportingComponent()
	case FieldRole:
		return o.GetRole()
	case FieldImageRole:
		return o.GetImageRole()
	case FieldAttributed:
		return strconv.FormatBool(o.GetSandbox().GetId() != "")
	}
	return ""
}

// labels returns the sorted label pairs of o (empty values omitted).
func (l *labeler) labels(o *eventpipev1.Occurrence, dst []labelPair) []labelPair {
	dst = dst[:0]
	dst = append(dst, l.static...)
	for _, f := range l.fields {
		if v := sanitizeValue(fieldValue(o, f), l.maxValue); v != "" {
			dst = append(dst, labelPair{f, v})
		}
	}
	slices.SortFunc(dst, func(a, b labelPair) int { return strings.Compare(a.name, b.name) })
	return dst
}

// labelString renders pairs as Loki's stream selector {a="x", b="y"}.
// Values are already free of control characters; quotes and backslashes are
// escaped, so the string parses back to exactly these pairs.
func labelString(pairs []labelPair) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.name)
		b.WriteString(`="`)
		for j := 0; j < len(p.value); j++ {
			c := p.value[j]
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// sanitizeValue makes s safe as a label value: valid UTF-8 (invalid bytes
// become U+FFFD), control characters (line breaks included) become spaces,
// surrounding space is trimmed, and the result is cut to max bytes on a rune
// boundary.
func sanitizeValue(s string, max int) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c >= utf8.RuneSelf {
			clean = false
			break
		}
	}
	if !clean {
		var b strings.Builder
		for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
				r = ' '
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	s = strings.TrimSpace(s)
	return jsonenc.CutUTF8(s, max)
}

// metadata returns the structured metadata of o, in a fixed order, empty
// values omitted. Values are valid UTF-8 and capped.
func metadata(o *eventpipev1.Occurrence, occurred time.Time, dst []labelPair) []labelPair {
	return appendMetadata(dst[:0], o, occurred)
}

// appendMetadata appends the structured metadata of o to dst.
func appendMetadata(dst []labelPair, o *eventpipev1.Occurrence, occurred time.Time) []labelPair {
	add := func(name, v string) {
		if v == "" {
			return
		}
		if !utf8.ValidString(v) {
			v = strings.ToValidUTF8(v, "\uFFFD")
		}
		dst = append(dst, labelPair{name, jsonenc.CutUTF8(v, maxMetaBytes)})
	}
	add(MetaEventID, o.GetEventId())
	if !occurred.IsZero() {
		add(MetaOccurredAt, string(jsonenc.AppendTime(nil, occurred)))
	}
	add(MetaSandboxID, o.GetSandbox().GetId())
	add(MetaSandboxName, o.GetSandbox().GetName())
	add(MetaReason, o.GetReason())
	add(MetaPullCategory, o.GetPullFailure().GetCategory())
	add(MetaBlockerCause, o.GetBlocker().GetCause())
	add(MetaContainer, o.GetContainer())
	image := o.GetImage()
	if image == "" {
		image = o.GetPullFailure().GetImage()
	}
	add(MetaImage, image)
	return dst
}

// occurredAt is the occurrence time: occurred_at, else observed_at, else
// zero (the caller stamps it with the push time).
func occurredAt(o *eventpipev1.Occurrence) time.Time {
	if ts := o.GetOccurredAt(); ts != nil && (ts.Seconds != 0 || ts.Nanos != 0) && ts.IsValid() {
		return ts.AsTime()
	}
	if ts := o.GetObservedAt(); ts != nil && (ts.Seconds != 0 || ts.Nanos != 0) && ts.IsValid() {
		return ts.AsTime()
	}
	return time.Time{}
}

// appendLine appends the line of o to dst: its protojson form (the
// encoder shared with the file sink), with the message capped at maxMessage
// (message_truncated set when cut), every other string at maxFieldBytes,
// and a zero or out-of-range timestamp left out rather than failing, so
// every occurrence has a line. Empty fields are left out, so the same
// occurrence always gives the same bytes.
func appendLine(dst []byte, o *eventpipev1.Occurrence, maxMessage int) []byte {
	b, _ := jsonenc.AppendOccurrence(dst, o, jsonenc.Options{
		MaxMessageBytes: maxMessage,
		MaxStringBytes:  maxFieldBytes,
		OmitBadTimes:    true, // so the encoder cannot fail
	})
	return b
}

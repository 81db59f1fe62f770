package loki

import (
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

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
	return truncateUTF8(s, max)
}

// truncateUTF8 cuts valid UTF-8 s to at most max bytes without splitting a
// rune.
func truncateUTF8(s string, max int) string { return cutUTF8(s, max) }

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
		dst = append(dst, labelPair{name, truncateUTF8(v, maxMetaBytes)})
	}
	add(MetaEventID, o.GetEventId())
	if !occurred.IsZero() {
		add(MetaOccurredAt, occurred.UTC().Format(time.RFC3339Nano))
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

// lineWriter appends an occurrence's line: one JSON object whose field order
// is fixed (README.md), with empty fields omitted, so that the same
// occurrence always gives the same bytes.
type lineWriter struct {
	b     []byte
	first bool
}

func (w *lineWriter) key(k string) {
	if !w.first {
		w.b = append(w.b, ',')
	}
	w.first = false
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
}

func (w *lineWriter) str(k, v string) {
	if v == "" {
		return
	}
	w.key(k)
	w.b = appendJSONString(w.b, v, maxFieldBytes)
}

func (w *lineWriter) ts(k string, t *timestamppb.Timestamp) {
	if t == nil || (t.Seconds == 0 && t.Nanos == 0) || !t.IsValid() {
		return
	}
	w.key(k)
	w.b = append(w.b, '"')
	w.b = t.AsTime().UTC().AppendFormat(w.b, time.RFC3339Nano)
	w.b = append(w.b, '"')
}

func (w *lineWriter) num(k string, v int64) {
	if v == 0 {
		return
	}
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
}

func (w *lineWriter) boolean(k string, v bool) {
	if !v {
		return
	}
	w.key(k)
	w.b = append(w.b, "true"...)
}

func (w *lineWriter) open(k string) {
	w.key(k)
	w.b = append(w.b, '{')
	w.first = true
}

func (w *lineWriter) close() {
	w.b = append(w.b, '}')
	w.first = false
}

// appendLine appends the line of o to dst.
func appendLine(dst []byte, o *eventpipev1.Occurrence, maxMessage int) []byte {
	w := lineWriter{b: append(dst, '{'), first: true}
	w.key("event_id")
	w.b = appendJSONString(w.b, o.GetEventId(), maxFieldBytes)
	w.ts("occurred_at", o.GetOccurredAt())
	w.ts("observed_at", o.GetObservedAt())
	w.str("cluster", o.GetCluster())
	w.str("namespace", o.GetNamespace())
	if sb := o.GetSandbox(); sb != nil {
		w.open("sandbox")
		w.str("id", sb.GetId())
		w.str("name", sb.GetName())
		w.str("workspace", sb.GetWorkspace())
		w.str("gateway_id", sb.GetGatewayId())
		w.str("cr_namespace", sb.GetCrNamespace())
		w.str("cr_name", sb.GetCrName())
		w.ts("deleted_at", sb.GetDeletedAt())
		w.close()
	}
	w.str("attribution", o.GetAttribution())
	w.str("role", o.GetRole())
	w.str("reason", o.GetReason())
	w.str("type", o.GetType())
	if io := o.GetInvolvedObject(); io != nil {
		w.open("involved_object")
		w.str("kind", io.GetKind())
		w.str("api_version", io.GetApiVersion())
		w.str("namespace", io.GetNamespace())
		w.str("name", io.GetName())
		w.str("uid", io.GetUid())
		w.str("field_path", io.GetFieldPath())
		w.close()
	}
	w.str("container", o.GetContainer())
	w.str("image", o.GetImage())
	w.str("image_role", o.GetImageRole())
	if pf := o.GetPullFailure(); pf != nil {
		w.open("pull_failure")
		w.str("category", pf.GetCategory())
		w.str("image", pf.GetImage())
		w.str("disposition", pf.GetDisposition())
		w.num("attempts", int64(pf.GetAttempts()))
		w.ts("first_seen", pf.GetFirstSeen())
		w.ts("last_seen", pf.GetLastSeen())
		w.str("detail", pf.GetDetail())
		w.str("source", pf.GetSource())
		w.str("decided_by", pf.GetDecidedBy())
		w.str("confidence", pf.GetConfidence())
		w.close()
	}
	if p := o.GetProgress(); p != nil {
		w.open("progress")
		w.str("complete_step", p.GetCompleteStep())
		w.str("complete_label", p.GetCompleteLabel())
		w.str("active_step", p.GetActiveStep())
		w.str("active_detail", p.GetActiveDetail())
		w.close()
	}
	if bl := o.GetBlocker(); bl != nil {
		w.open("blocker")
		w.str("kind", bl.GetKind())
		w.str("cause", bl.GetCause())
		w.str("object", bl.GetObject())
		w.str("container", bl.GetContainer())
		w.str("disposition", bl.GetDisposition())
		w.num("attempts", int64(bl.GetAttempts()))
		w.ts("first_seen", bl.GetFirstSeen())
		w.ts("last_seen", bl.GetLastSeen())
		w.str("detail", bl.GetDetail())
		w.str("source", bl.GetSource())
		w.str("fix", bl.GetFix())
		w.num("exit_code", int64(bl.GetExitCode()))
		w.boolean("has_exit_code", bl.GetHasExitCode())
		w.str("decided_by", bl.GetDecidedBy())
		w.str("confidence", bl.GetConfidence())
		w.close()
	}
	msg := o.GetMessage()
	truncated := o.GetMessageTruncated()
	w.key("message")
	w.b = appendJSONString(w.b, msg, maxMessage)
	if len(msg) > maxMessage {
		truncated = true
	}
	w.boolean("message_truncated", truncated)
	w.num("count", int64(o.GetCount()))
	w.str("reporting_component", o.GetReportingComponent())
	w.str("reporting_instance", o.GetReportingInstance())
	w.str("action", o.GetAction())
	if ev := o.GetEvent(); ev != nil {
		w.open("event")
		w.str("name", ev.GetName())
		w.str("uid", ev.GetUid())
		w.str("resource_version", ev.GetResourceVersion())
		w.str("api_version", ev.GetApiVersion())
		w.close()
	}
	w.num("schema_version", int64(o.GetSchemaVersion()))
	w.b = append(w.b, '}')
	return w.b
}

// appendJSONString appends s as a JSON string of at most max bytes of
// input: invalid UTF-8 becomes U+FFFD, control characters are escaped (the
// escaping shared with the file and Kafka sinks), and the cut never splits a
// rune.
func appendJSONString(dst []byte, s string, max int) []byte {
	return jsonenc.AppendString(dst, cutUTF8(s, max))
}

// cutUTF8 cuts s to at most max bytes, backing off (at most three bytes)
// so that a multi-byte rune is not split.
func cutUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for back := 0; back < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(s[cut]); back++ {
		cut--
	}
	return s[:cut]
}

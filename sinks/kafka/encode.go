package kafka

import (
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
	"github.com/eventpipe/eventpipe/sinks/internal/sanitize"
)

// CloudEvents attributes.
const (
	SpecVersion     = "1.0"
	EventType       = "ai.openshell.eventpipe.occurrence.v1"
	ContentJSON     = "application/json"
	ContentProtobuf = "application/protobuf"
	// ValueSchema is the "schema" member of every JSON value; it changes
	// only when a field changes meaning (fields are only ever added).
	ValueSchema = "eventpipe.occurrence.v1"
)

// Key is the record key: the sandbox id, else "<namespace>/<involved object
// uid>", else the event_id.
func Key(o *eventpipev1.Occurrence) string {
	if id := o.GetSandbox().GetId(); id != "" {
		return id
	}
	if uid := o.GetInvolvedObject().GetUid(); uid != "" {
		return o.GetNamespace() + "/" + uid
	}
	return o.GetEventId()
}

// encoder turns occurrences into kafka messages. It is not safe for
// concurrent use; its buffers are reused between calls.
type encoder struct {
	format   string
	source   string
	maxBytes int
}

// overhead is what a record adds to key, value and headers on the wire
// (attributes, varints, record-batch share), with margin.
const overhead = 128

func messageSize(m *kafka.Message) int {
	n := len(m.Key) + len(m.Value) + overhead
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// encode builds the message for o. If it is over maxBytes the message
// field is cut (on a rune boundary) and message_truncated set; truncated
// reports that. fits is false when even an empty message field does not
// fit: the record must be refused.
func (e *encoder) encode(o *eventpipev1.Occurrence) (msg kafka.Message, truncated, fits bool, err error) {
	if e.format == FormatProtobuf {
		// proto.Marshal refuses invalid UTF-8; AppendJSON replaces it itself.
		o = sanitize.ValidUTF8(o)
	}
	msg, err = e.build(o)
	if err != nil {
		return msg, false, false, err
	}
	over := messageSize(&msg) - e.maxBytes
	if over <= 0 {
		return msg, false, true, nil
	}
	full := o.GetMessage()
	// Escaping can make the encoded message longer than the raw one, so cut
	// by the measured excess and re-measure; a few rounds always settle.
	keep := len(full)
	for round := 0; round < 8 && over > 0; round++ {
		keep -= over
		if keep < 0 {
			keep = 0
		}
		for keep > 0 && !utf8.RuneStart(full[keep]) {
			keep--
		}
		c := proto.Clone(o).(*eventpipev1.Occurrence)
		c.Message = full[:keep]
		c.MessageTruncated = true
		if msg, err = e.build(c); err != nil {
			return msg, false, false, err
		}
		over = messageSize(&msg) - e.maxBytes
		if keep == 0 {
			break
		}
	}
	return msg, true, over <= 0, nil
}

func (e *encoder) build(o *eventpipev1.Occurrence) (kafka.Message, error) {
	var value []byte
	var ct string
	switch e.format {
	case FormatProtobuf:
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(o)
		if err != nil {
			return kafka.Message{}, err
		}
		value, ct = b, ContentProtobuf
	default:
		value, ct = AppendJSON(make([]byte, 0, 2048+len(o.GetMessage())), o), ContentJSON
	}
	h := make([]kafka.Header, 0, 7)
	h = append(h,
		kafka.Header{Key: "ce_specversion", Value: []byte(SpecVersion)},
		kafka.Header{Key: "ce_id", Value: validBytes(o.GetEventId())},
		kafka.Header{Key: "ce_source", Value: validBytes(e.ceSource(o))},
		kafka.Header{Key: "ce_type", Value: []byte(EventType)},
	)
	if t := o.GetOccurredAt(); t != nil {
		h = append(h, kafka.Header{Key: "ce_time", Value: t.AsTime().UTC().AppendFormat(nil, time.RFC3339Nano)})
	}
	if id := o.GetSandbox().GetId(); id != "" {
		h = append(h, kafka.Header{Key: "ce_subject", Value: validBytes(id)})
	}
	h = append(h, kafka.Header{Key: "content-type", Value: []byte(ct)})
	return kafka.Message{Key: []byte(Key(o)), Value: value, Headers: h}, nil
}

func validBytes(s string) []byte {
	if utf8.ValidString(s) {
		return []byte(s)
	}
	return []byte(strings.ToValidUTF8(s, "\uFFFD"))
}

func (e *encoder) ceSource(o *eventpipev1.Occurrence) string {
	cluster, comp := o.GetCluster(), o.GetReportingComponent()
	if cluster == "" {
		cluster = "unknown"
	}
	if comp == "" {
		comp = "unknown"
	}
	return e.source + url.PathEscape(cluster) + "/" + url.PathEscape(comp)
}

// AppendJSON appends the versioned JSON value of o (see README.md): every
// member always present, in the documented order (the proto field order),
// absent sub-objects as null, times in RFC 3339 UTC. Strings that are not
// valid UTF-8 get U+FFFD in place of the bad bytes.
func AppendJSON(b []byte, o *eventpipev1.Occurrence) []byte {
	b = append(b, `{"schema":"`+ValueSchema+`","schema_version":`...)
	b = strconv.AppendUint(b, uint64(o.GetSchemaVersion()), 10)
	b = str(b, "event_id", o.GetEventId())
	b = ts(b, "occurred_at", o.GetOccurredAt())
	b = ts(b, "observed_at", o.GetObservedAt())
	b = str(b, "cluster", o.GetCluster())
	b = str(b, "namespace", o.GetNamespace())
	if ev := o.GetEvent(); ev != nil {
		b = append(b, `,"event":{"name":`...)
		b = appendString(b, ev.GetName())
		b = str(b, "uid", ev.GetUid())
		b = str(b, "resource_version", ev.GetResourceVersion())
		b = str(b, "api_version", ev.GetApiVersion())
		b = append(b, '}')
	} else {
		b = append(b, `,"event":null`...)
	}
	if io := o.GetInvolvedObject(); io != nil {
		b = append(b, `,"involved_object":{"kind":`...)
		b = appendString(b, io.GetKind())
		b = str(b, "api_version", io.GetApiVersion())
		b = str(b, "namespace", io.GetNamespace())
		b = str(b, "name", io.GetName())
		b = str(b, "uid", io.GetUid())
		b = str(b, "field_path", io.GetFieldPath())
		b = append(b, '}')
	} else {
		b = append(b, `,"involved_object":null`...)
	}
	b = str(b, "type", o.GetType())
	b = str(b, "reason", o.GetReason())
	b = str(b, "message", o.GetMessage())
	b = append(b, `,"message_truncated":`...)
	b = strconv.AppendBool(b, o.GetMessageTruncated())
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(o.GetCount()), 10)
	b = str(b, "reporting_component", o.GetReportingComponent())
	b = str(b, "reporting_instance", o.GetReportingInstance())
	b = str(b, "action", o.GetAction())
	if s := o.GetSandbox(); s != nil {
		b = append(b, `,"sandbox":{"id":`...)
		b = appendString(b, s.GetId())
		b = str(b, "name", s.GetName())
		b = str(b, "workspace", s.GetWorkspace())
		b = str(b, "gateway_id", s.GetGatewayId())
		b = str(b, "cr_namespace", s.GetCrNamespace())
		b = str(b, "cr_name", s.GetCrName())
		b = append(b, '}')
	} else {
		b = append(b, `,"sandbox":null`...)
	}
	b = str(b, "attribution", o.GetAttribution())
	b = str(b, "role", o.GetRole())
	b = str(b, "container", o.GetContainer())
	b = str(b, "image", o.GetImage())
	b = str(b, "image_role", o.GetImageRole())
	if p := o.GetPullFailure(); p != nil {
		b = append(b, `,"pull_failure":{"category":`...)
		b = appendString(b, p.GetCategory())
		b = str(b, "image", p.GetImage())
		b = str(b, "disposition", p.GetDisposition())
		b = append(b, `,"attempts":`...)
		b = strconv.AppendUint(b, uint64(p.GetAttempts()), 10)
		b = ts(b, "first_seen", p.GetFirstSeen())
		b = ts(b, "last_seen", p.GetLastSeen())
		b = str(b, "detail", p.GetDetail())
		b = str(b, "source", p.GetSource())
		b = append(b, '}')
	} else {
		b = append(b, `,"pull_failure":null`...)
	}
	if p := o.GetProgress(); p != nil {
		b = append(b, `,"progress":{"complete_step":`...)
		b = appendString(b, p.GetCompleteStep())
		b = str(b, "complete_label", p.GetCompleteLabel())
		b = str(b, "active_step", p.GetActiveStep())
		b = str(b, "active_detail", p.GetActiveDetail())
		b = append(b, '}')
	} else {
		b = append(b, `,"progress":null`...)
	}
	return append(b, '}')
}

func str(b []byte, name, v string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, v)
}

func ts(b []byte, name string, t *timestamppb.Timestamp) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	if t == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.AsTime().UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendString is encoding/json's string escaping.
func appendString(b []byte, s string) []byte { return jsonenc.AppendString(b, s) }

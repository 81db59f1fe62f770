package kafka

import (
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/sanitize"
	"github.com/eventpipe/eventpipe/sinks/internal/jsonenc"
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
func Key(o *eventpipev1.Occurrence) string { return string(appendKey(nil, o)) }

func appendKey(b []byte, o *eventpipev1.Occurrence) []byte {
	if id := o.GetSandbox().GetId(); id != "" {
		return append(b, id...)
	}
	if uid := o.GetInvolvedObject().GetUid(); uid != "" {
		b = append(b, o.GetNamespace()...)
		b = append(b, '/')
		return append(b, uid...)
	}
	return append(b, o.GetEventId()...)
}

// encoder turns occurrences into Kafka records. It is not safe for
// concurrent use.
//
// The bytes of one push's messages (keys, values, header values) live in
// one arena and their headers in one slice. A push's arena is reused by the
// next push only when the client is done with every record of the push
// (finish with reuse): otherwise the next push gets a fresh one.
type encoder struct {
	format   string
	source   string
	maxBytes int

	arena   []byte
	headers []kgo.RecordHeader
	perMsg  int // arena bytes per message in the previous push (sizing)

	spare     []byte // a finished push's arena, free for the next one
	spareHdrs []kgo.RecordHeader
}

// maxSpareBytes bounds the arena kept between pushes (one huge batch does
// not pin its memory).
const maxSpareBytes = 16 << 20

// HeaderVersion is the record header naming the eventpipe build that wrote
// the record (api/buildinfo: the version `eventpipe version` prints).
const HeaderVersion = "eventpipe-version"

// Header values that never change, shared by every record (franz-go only
// reads them).
var (
	hdrSpecVersion = []byte(SpecVersion)
	hdrType        = []byte(EventType)
	hdrJSON        = []byte(ContentJSON)
	hdrProtobuf    = []byte(ContentProtobuf)
	hdrOCSF        = []byte(ContentOCSF)
	hdrVersion     = []byte(buildinfo.Version())
)

// start prepares the arena for n messages: the spare one when it is large
// enough, else a fresh one.
func (e *encoder) start(n int) {
	per := e.perMsg
	if per <= 0 {
		per = 2048
	}
	if size := n*per + per; cap(e.spare) >= size {
		e.arena = e.spare[:0]
	} else {
		e.arena = make([]byte, 0, size)
	}
	if cap(e.spareHdrs) >= n*8 {
		e.headers = e.spareHdrs[:0]
	} else {
		e.headers = make([]kgo.RecordHeader, 0, n*8)
	}
	e.spare, e.spareHdrs = nil, nil
}

// finish ends a push of n messages. reuse says that the client is done with
// every record of the push (each has its outcome): the arena then serves
// the next push. Otherwise the records alone keep it alive, as long as the
// client needs them.
func (e *encoder) finish(n int, reuse bool) {
	if n > 0 && len(e.arena) > 0 {
		e.perMsg = len(e.arena)/n + 64
	}
	if reuse && cap(e.arena) <= maxSpareBytes {
		e.spare, e.spareHdrs = e.arena[:0], e.headers[:0]
	}
	e.arena, e.headers = nil, nil
}

// bytes appends s to the arena (invalid UTF-8 replaced) and returns the
// copy.
func (e *encoder) bytes(s string) []byte {
	start := len(e.arena)
	if utf8.ValidString(s) {
		e.arena = append(e.arena, s...)
	} else {
		e.arena = append(e.arena, strings.ToValidUTF8(s, "\uFFFD")...)
	}
	return e.arena[start:len(e.arena):len(e.arena)]
}

// overhead is what a record adds to key, value and headers on the wire
// (attributes, varints, record-batch share), with margin.
const overhead = 128

func messageSize(m *kgo.Record) int {
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
func (e *encoder) encode(o *eventpipev1.Occurrence) (msg kgo.Record, truncated, fits bool, err error) {
	mark, hmark := len(e.arena), len(e.headers)
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
		e.arena, e.headers = e.arena[:mark], e.headers[:hmark] // drop the attempt that did not fit
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

func (e *encoder) build(o *eventpipev1.Occurrence) (kgo.Record, error) {
	if e.arena == nil {
		e.start(1) // encode called outside a push (tests, benchmarks)
	}
	var value, ct []byte
	start := len(e.arena)
	switch e.format {
	case FormatProtobuf:
		// proto.Marshal refuses invalid UTF-8 (AppendJSON replaces it
		// itself). Marshal first and repair only on failure: checking every
		// string up front is a reflective walk per record.
		b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(e.arena, o)
		if err != nil {
			o = sanitize.ValidUTF8(o)
			if b, err = (proto.MarshalOptions{Deterministic: true}).MarshalAppend(e.arena, o); err != nil {
				return kgo.Record{}, err
			}
		}
		e.arena, ct = b, hdrProtobuf
	case FormatOCSF:
		b, err := AppendOCSF(e.arena, o)
		if err != nil {
			return kgo.Record{}, err
		}
		e.arena, ct = b, hdrOCSF
	default:
		e.arena, ct = AppendJSON(e.arena, o), hdrJSON
	}
	value = e.arena[start:len(e.arena):len(e.arena)]
	h0 := len(e.headers)
	e.headers = append(e.headers,
		kgo.RecordHeader{Key: "ce_specversion", Value: hdrSpecVersion},
		kgo.RecordHeader{Key: "ce_id", Value: e.bytes(o.GetEventId())},
		kgo.RecordHeader{Key: "ce_source", Value: e.ceSource(o)},
		kgo.RecordHeader{Key: "ce_type", Value: hdrType},
	)
	if t := o.GetOccurredAt(); t != nil {
		start := len(e.arena)
		e.arena = t.AsTime().UTC().AppendFormat(e.arena, time.RFC3339Nano)
		e.headers = append(e.headers, kgo.RecordHeader{Key: "ce_time", Value: e.arena[start:len(e.arena):len(e.arena)]})
	}
	if id := o.GetSandbox().GetId(); id != "" {
		e.headers = append(e.headers, kgo.RecordHeader{Key: "ce_subject", Value: e.bytes(id)})
	}
	e.headers = append(e.headers, kgo.RecordHeader{Key: "content-type", Value: ct}, kgo.RecordHeader{Key: HeaderVersion, Value: hdrVersion})
	return kgo.Record{Key: e.key(o), Value: value, Headers: e.headers[h0:len(e.headers):len(e.headers)]}, nil
}

// key appends Key(o) to the arena.
func (e *encoder) key(o *eventpipev1.Occurrence) []byte {
	start := len(e.arena)
	e.arena = appendKey(e.arena, o)
	return e.arena[start:len(e.arena):len(e.arena)]
}

// ceSource appends the ce_source value of o to the arena.
func (e *encoder) ceSource(o *eventpipev1.Occurrence) []byte {
	cluster, comp := o.GetCluster(), o.GetReportingComponent()
	if cluster == "" {
		cluster = "unknown"
	}
	if comp == "" {
		comp = "unknown"
	}
	start := len(e.arena)
	e.arena = append(e.arena, e.source...)
	e.arena = appendPathEscaped(e.arena, cluster)
	e.arena = append(e.arena, '/')
	e.arena = appendPathEscaped(e.arena, comp)
	v := e.arena[start:]
	if !utf8.Valid(v) { // e.source is validated; escaping leaves only ASCII
		fixed := strings.ToValidUTF8(string(v), "\uFFFD")
		e.arena = append(e.arena[:start], fixed...)
	}
	return e.arena[start:len(e.arena):len(e.arena)]
}

// appendPathEscaped appends url.PathEscape(s), copying s as is when it
// needs no escaping (the usual case: cluster and component names).
func appendPathEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
			return append(b, url.PathEscape(s)...)
		}
	}
	return append(b, s...)
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
		if t := s.GetDeletedAt(); t != nil {
			b = ts(b, "deleted_at", t)
		}
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
		b = str(b, "decided_by", p.GetDecidedBy())
		b = str(b, "confidence", p.GetConfidence())
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
	if bl := o.GetBlocker(); bl != nil {
		b = append(b, `,"blocker":{"kind":`...)
		b = appendString(b, bl.GetKind())
		b = str(b, "cause", bl.GetCause())
		b = str(b, "object", bl.GetObject())
		b = str(b, "container", bl.GetContainer())
		b = str(b, "disposition", bl.GetDisposition())
		b = append(b, `,"attempts":`...)
		b = strconv.AppendUint(b, uint64(bl.GetAttempts()), 10)
		b = ts(b, "first_seen", bl.GetFirstSeen())
		b = ts(b, "last_seen", bl.GetLastSeen())
		b = str(b, "detail", bl.GetDetail())
		b = str(b, "source", bl.GetSource())
		b = str(b, "fix", bl.GetFix())
		b = append(b, `,"exit_code":`...)
		b = strconv.AppendInt(b, int64(bl.GetExitCode()), 10)
		b = append(b, `,"has_exit_code":`...)
		b = strconv.AppendBool(b, bl.GetHasExitCode())
		b = str(b, "decided_by", bl.GetDecidedBy())
		b = str(b, "confidence", bl.GetConfidence())
		b = append(b, '}')
	} else {
		b = append(b, `,"blocker":null`...)
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

package backbone

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/eventpipe/eventpipe/api/buildinfo"
	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/api/sanitize"
	"github.com/eventpipe/eventpipe/sinks/kafka"
)

// Header keys of a backbone record. The ce_* keys and their values are the
// ones the Kafka sink writes in binary CloudEvents mode, so a consumer
// outside eventpipe reads the backbone and the archive topic alike and can
// remove duplicates by ce_id (the occurrence's event_id).
const (
	HeaderSpecVersion = "ce_specversion"
	HeaderID          = "ce_id"
	HeaderType        = "ce_type"
	HeaderTime        = "ce_time"
	HeaderSubject     = "ce_subject"
	HeaderContentType = "content-type"
	// HeaderCluster and HeaderStream name the agent stream the record was
	// ingested from (the stream is not part of the occurrence).
	HeaderCluster = "eventpipe-cluster"
	HeaderStream  = "eventpipe-stream"
	// HeaderVersion names the eventpipe build of the replica that wrote
	// the record (api/buildinfo), the header the Kafka sink writes
	// too: during a rolling update it tells which build ingested what.
	HeaderVersion = kafka.HeaderVersion
)

// hdrVersion is the build's version, the same for every record.
var hdrVersion = []byte(buildinfo.Version())

// Encode builds the backbone record of one occurrence ingested on stream.
// The key is the Kafka sink's key (the sandbox id when there is one), so one
// sandbox's occurrences stay ordered in one partition. The value is the
// occurrence in deterministic protobuf, with invalid UTF-8 replaced (the
// protobuf encoder refuses it).
func Encode(o *eventpipev1.Occurrence, stream string) (*kgo.Record, error) {
	// proto.Marshal refuses a string that is not valid UTF-8 (input from
	// the cluster is untrusted). Checking every string up front costs a
	// reflective walk per record (a sixth of the collector's CPU in Kafka
	// mode, bench/kafka.md), so marshal first and repair only on failure.
	marshal := proto.MarshalOptions{Deterministic: true}
	value, err := marshal.Marshal(o)
	if err != nil {
		o = sanitize.ValidUTF8(o)
		if value, err = marshal.Marshal(o); err != nil {
			return nil, fmt.Errorf("encode occurrence %s: %w", o.GetEventId(), err)
		}
	}
	h := make([]kgo.RecordHeader, 0, 9)
	h = append(h,
		kgo.RecordHeader{Key: HeaderSpecVersion, Value: []byte(kafka.SpecVersion)},
		kgo.RecordHeader{Key: HeaderID, Value: []byte(o.GetEventId())},
		kgo.RecordHeader{Key: HeaderType, Value: []byte(kafka.EventType)},
		kgo.RecordHeader{Key: HeaderContentType, Value: []byte(kafka.ContentProtobuf)},
		kgo.RecordHeader{Key: HeaderCluster, Value: []byte(o.GetCluster())},
		kgo.RecordHeader{Key: HeaderStream, Value: []byte(stream)},
		kgo.RecordHeader{Key: HeaderVersion, Value: hdrVersion},
	)
	if t := o.GetOccurredAt(); t != nil {
		h = append(h, kgo.RecordHeader{Key: HeaderTime, Value: t.AsTime().UTC().AppendFormat(nil, time.RFC3339Nano)})
	}
	if id := o.GetSandbox().GetId(); id != "" {
		h = append(h, kgo.RecordHeader{Key: HeaderSubject, Value: []byte(id)})
	}
	return &kgo.Record{Key: []byte(kafka.Key(o)), Value: value, Headers: h}, nil
}

// ErrNotOccurrence marks a record that is not a backbone occurrence (wrong
// content type or undecodable value): consumers count and skip it, they
// never stop on it.
var ErrNotOccurrence = errors.New("not an eventpipe occurrence record")

// Decode returns the occurrence a backbone record carries.
func Decode(r *kgo.Record) (*eventpipev1.Occurrence, error) {
	if ct := header(r, HeaderContentType); ct != kafka.ContentProtobuf {
		return nil, fmt.Errorf("%w: %s/%d@%d has content-type %q", ErrNotOccurrence, r.Topic, r.Partition, r.Offset, ct)
	}
	o := new(eventpipev1.Occurrence)
	if err := proto.Unmarshal(r.Value, o); err != nil {
		return nil, fmt.Errorf("%w: %s/%d@%d: %v", ErrNotOccurrence, r.Topic, r.Partition, r.Offset, err)
	}
	return o, nil
}

// EventID is the record's ce_id header: the event_id, read without
// decoding the value (what dedupe needs).
func EventID(r *kgo.Record) string { return header(r, HeaderID) }

// Stream is the agent stream the record was ingested from.
func Stream(r *kgo.Record) string { return header(r, HeaderStream) }

func header(r *kgo.Record, key string) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}

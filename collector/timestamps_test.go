package collector

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Issue 21 defect 3: an occurrence whose occurred_at (or any other
// Timestamp) protobuf cannot represent was acknowledged, then dropped for
// good by the file sink, whose encoder cannot write it. It is now refused
// at ingest, reported in the ack with the field at fault, and the file sink
// holds exactly the valid occurrences.
func TestIngestRefusesTimestampsNoSinkCanWrite(t *testing.T) {
	dir := t.TempDir()
	jsonl := filepath.Join(dir, "events.jsonl")
	cfg := testConfig(t, dir)
	cfg.Sinks = []SinkConfig{fileSink("archive", jsonl)}
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good := occ("good/1", "sb-1", "ws1", "one", "gw-a")
	farPast := occ("far-past/1", "sb-1", "ws1", "one", "gw-a")
	farPast.OccurredAt = &timestamppb.Timestamp{Seconds: -1e12}
	badNanos := occ("bad-nanos/1", "sb-1", "ws1", "one", "gw-a")
	badNanos.ObservedAt = &timestamppb.Timestamp{Seconds: 1_790_000_000, Nanos: 2e9}
	nested := occ("nested/1", "sb-1", "ws1", "one", "gw-a")
	nested.PullFailure = &eventpipev1.PullFailure{Category: "not_found", LastSeen: &timestamppb.Timestamp{Seconds: 253402300800}} // 10000-01-01
	edge := occ("year-9999/1", "sb-1", "ws1", "one", "gw-a")
	edge.OccurredAt = &timestamppb.Timestamp{Seconds: 253402300799, Nanos: 999_999_999} // the last valid instant

	acks, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), batch(1, "prod", "10", good, farPast, badNanos, nested, edge))
	if err != nil {
		t.Fatal(err)
	}
	a := acks[0]
	if a.GetStored() != 2 {
		t.Errorf("stored %d, want 2 (the valid one and the one at the end of year 9999)", a.GetStored())
	}
	want := map[uint32]string{1: "occurred_at is outside", 2: "observed_at is outside", 3: "pull_failure.last_seen is outside"}
	if len(a.GetRejected()) != len(want) {
		t.Fatalf("rejected %v, want indexes 1, 2, 3", a.GetRejected())
	}
	for _, rj := range a.GetRejected() {
		if w, ok := want[rj.GetIndex()]; !ok || rj.GetReason() != reasonInvalid || !strings.Contains(rj.GetMessage(), w) {
			t.Errorf("rejection %v, want reason %q and %q", rj, reasonInvalid, w)
		}
	}
	if got := counterValue(t, r.reg, "eventpipe_collector_ingest_rejected_occurrences_total", map[string]string{"reason": reasonInvalid}); got != 3 {
		t.Errorf("rejected_occurrences_total{reason=invalid} = %v, want 3", got)
	}
	// Everything acknowledged reaches the file, and nothing else.
	for deadline := time.Now().Add(10 * time.Second); len(readJSONL(t, jsonl)) < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	got := readJSONL(t, jsonl)
	if len(got) != 2 || got["good/1"] != 1 || got["year-9999/1"] != 1 {
		t.Errorf("file sink holds %v, want good/1 and year-9999/1 once each", got)
	}
}

// Every google.protobuf.Timestamp of the Occurrence schema, at any depth
// (found from the descriptor), is checked by badTimestamp: set out of range
// alone, it is reported with its path.
func TestBadTimestampCoversEveryTimestampField(t *testing.T) {
	tsName := (&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName()
	var paths [][]protoreflect.FieldDescriptor
	var walk func(md protoreflect.MessageDescriptor, prefix []protoreflect.FieldDescriptor, depth int)
	walk = func(md protoreflect.MessageDescriptor, prefix []protoreflect.FieldDescriptor, depth int) {
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.Message() == nil || fd.IsList() || fd.IsMap() || depth > 4 {
				continue
			}
			p := append(append([]protoreflect.FieldDescriptor(nil), prefix...), fd)
			if fd.Message().FullName() == tsName {
				paths = append(paths, p)
				continue
			}
			walk(fd.Message(), p, depth+1)
		}
	}
	walk((&eventpipev1.Occurrence{}).ProtoReflect().Descriptor(), nil, 0)
	if len(paths) < 6 {
		t.Fatalf("found %d Timestamp fields, want at least 6", len(paths))
	}
	for _, p := range paths {
		var names []string
		o := &eventpipev1.Occurrence{}
		m := o.ProtoReflect()
		for _, fd := range p[:len(p)-1] {
			m = m.Mutable(fd).Message()
			names = append(names, string(fd.Name()))
		}
		last := p[len(p)-1]
		names = append(names, string(last.Name()))
		m.Set(last, protoreflect.ValueOfMessage((&timestamppb.Timestamp{Seconds: -1e12}).ProtoReflect()))
		want := strings.Join(names, ".")
		if got, _ := badTimestamp(o); got != want {
			t.Errorf("%s out of range: badTimestamp says %q", want, got)
		}
	}
}

// It runs on every ingested occurrence.
func BenchmarkBadTimestamp(b *testing.B) {
	o := occ("bench/1", "sb-1", "ws1", "one", "gw-a")
	o.PullFailure = &eventpipev1.PullFailure{Category: "not_found", FirstSeen: o.OccurredAt, LastSeen: o.OccurredAt}
	b.ReportAllocs()
	for b.Loop() {
		if p, _ := badTimestamp(o); p != "" {
			b.Fatal(p)
		}
	}
}

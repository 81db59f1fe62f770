package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// runner runs a sinks.Runner over a MemLog into s until the test ends.
type runner struct {
	r    *sinks.Runner
	log  *sinktest.MemLog
	stop func()
}

func runSink(t *testing.T, s *Sink, batch int) *runner {
	t.Helper()
	l := sinktest.NewMemLog()
	cur, _ := l.Cursor("kafka")
	cfg := sinks.NewDefaultRunnerConfig("kafka")
	cfg.Batch.MaxRecords = batch
	cfg.Batch.MaxWait = 20 * time.Millisecond
	cfg.Retry.Initial = 20 * time.Millisecond
	cfg.Retry.Max = 300 * time.Millisecond
	cfg.Retry.PushTimeout = 5 * time.Second
	r, err := sinks.NewRunner(cfg, s, l, cur, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	rn := &runner{r: r, log: l}
	var once sync.Once
	rn.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("runner: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(rn.stop)
	return rn
}

func waitCursor(t *testing.T, r *sinks.Runner, want uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for r.Status().Cursor < want {
		if time.Now().After(deadline) {
			t.Fatalf("cursor %d, want %d (status %+v)", r.Status().Cursor, want, r.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConsumerGroupReadsKeysHeadersInOrder produces through the runner and
// reads back with a franz-go consumer group, as an archive consumer would.
func TestConsumerGroupReadsKeysHeadersInOrder(t *testing.T) {
	b := startBroker(t)
	cfg := testConfig(b.addr(), "eventpipe.occurrences")
	cfg.CreateTopic.Partitions = 4
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rn := runSink(t, s, 100)
	g := sinktest.NewGenerator(11, "cg-")
	occs := g.Batch(400)
	if err := rn.log.Append(context.Background(), occs); err != nil {
		t.Fatal(err)
	}
	waitCursor(t, rn.r, 400, 30*time.Second)

	rd, err := kgo.NewClient(kgo.SeedBrokers(b.addr()), kgo.ConsumerGroup("audit-archive"), kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	byKey := map[string][]string{} // key -> ce_id in consumption order
	partOf := map[string]int32{}
	var got []*kgo.Record
	for len(got) < len(occs) {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("after %d records: %v", len(got), err)
		}
		got = append(got, fs.Records()...)
	}
	if err := rd.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range got {
		k := string(m.Key)
		if p, ok := partOf[k]; ok && p != m.Partition {
			t.Errorf("key %s in partitions %d and %d", k, p, m.Partition)
		}
		partOf[k] = m.Partition
		byKey[k] = append(byKey[k], header(m, "ce_id"))
		for _, h := range []string{"ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "content-type"} {
			if header(m, h) == "" {
				t.Fatalf("message without %s: %v", h, m.Headers)
			}
		}
		if header(m, "ce_specversion") != "1.0" || header(m, "ce_type") != EventType || header(m, "content-type") != ContentJSON {
			t.Fatalf("headers %v", m.Headers)
		}
		var v map[string]any
		if err := json.Unmarshal(m.Value, &v); err != nil {
			t.Fatalf("value is not JSON: %v", err)
		}
		if v["event_id"] != header(m, "ce_id") {
			t.Errorf("ce_id %q, value event_id %v", header(m, "ce_id"), v["event_id"])
		}
		if sb, _ := v["sandbox"].(map[string]any); sb != nil {
			if header(m, "ce_subject") != sb["id"] || k != sb["id"] {
				t.Errorf("key %q / ce_subject %q for sandbox %v", k, header(m, "ce_subject"), sb["id"])
			}
		} else if header(m, "ce_subject") != "" {
			t.Errorf("unattributed occurrence has ce_subject %q", header(m, "ce_subject"))
		}
	}
	// Per key, the consumption order is the log order.
	want := map[string][]string{}
	for _, o := range occs {
		want[Key(o)] = append(want[Key(o)], o.GetEventId())
	}
	if len(byKey) != len(want) {
		t.Errorf("%d keys consumed, want %d", len(byKey), len(want))
	}
	for k, ids := range want {
		if strings.Join(byKey[k], ",") != strings.Join(ids, ",") {
			t.Errorf("key %s: consumed order differs from log order", k)
		}
	}
	if len(byKey[sinktest.SeedSandboxID]) == 0 {
		t.Error("no record keyed by the seed sandbox id")
	}
	if _, ok := byKey["kube-system/5b0f3c9e-4a51-4f0c-9a43-2f1e1b8f6d11"]; !ok {
		t.Error("unattributed occurrences are not keyed namespace/involved uid")
	}
	// The group's commits are stored: a new reader in the group has nothing left.
	rd.Close()
	rd2, err := kgo.NewClient(kgo.SeedBrokers(b.addr()), kgo.ConsumerGroup("audit-archive"), kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd2.Close()
	short, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	if recs := rd2.PollFetches(short).Records(); len(recs) > 0 {
		t.Errorf("committed group re-read offset %d", recs[0].Offset)
	}
}

// TestBrokerOutageUnderSteadyTraffic stops the broker for a while under
// steady traffic and starts it again with its data: everything arrives.
func TestBrokerOutageUnderSteadyTraffic(t *testing.T) {
	b := startBroker(t)
	cfg := testConfig(b.addr(), "outage")
	s, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rn := runSink(t, s, 200)
	g := sinktest.NewGenerator(12, "outage-")
	var ids []string
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	stopped, restarted := false, false
	var maxLag uint64
	var appendedWhileDown int // records appended between stop and restart
	for time.Since(start) < 4*time.Second {
		<-tick.C
		occs := g.Batch(20)
		for _, o := range occs {
			ids = append(ids, o.GetEventId())
		}
		if err := rn.log.Append(context.Background(), occs); err != nil {
			t.Fatal(err)
		}
		if stopped && !restarted {
			appendedWhileDown += len(occs)
		}
		switch el := time.Since(start); {
		case el > time.Second && !stopped:
			b.stop()
			stopped = true
		case el > 2500*time.Millisecond && !restarted:
			maxLag = rn.r.Status().LagRecords
			b.start()
			restarted = true
		}
	}
	waitCursor(t, rn.r, uint64(len(ids)), 60*time.Second)
	st := rn.r.Status()
	if st.Failed != 0 || st.Lost != 0 {
		t.Fatalf("status %+v: records dropped across a broker outage", st)
	}
	// While the broker was down nothing was delivered: the lag covers what
	// was appended meanwhile, less at most the one batch read before the
	// stop. (How many that is depends on the machine's load: the ticker
	// drops ticks on a busy machine, so no fixed number.)
	if appendedWhileDown == 0 || maxLag+200 < uint64(appendedWhileDown) {
		t.Errorf("lag during the outage was %d records with %d appended while down: the broker was not really down", maxLag, appendedWhileDown)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := readTopic(ctx, nil, b.addr(), cfg.Topic)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, m := range msgs {
		got[header(m, "ce_id")]++
	}
	var missing int
	for _, id := range ids {
		if got[id] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d occurrences missing after the outage", missing, len(ids))
	}
	t.Logf("%d occurrences, %d records in the topic (%d duplicates), lag peaked at %d", len(ids), len(msgs), len(msgs)-len(ids), maxLag)
}

// TestHostileInput: a 1 MiB message, invalid UTF-8 and injection text in
// every field are delivered (truncated and marked where needed) or
// counted, never a crash.
func TestHostileInput(t *testing.T) {
	b := startBroker(t)
	for _, format := range []string{FormatJSON, FormatProtobuf, FormatOCSF} {
		t.Run(format, func(t *testing.T) {
			cfg := testConfig(b.addr(), "hostile-"+format)
			cfg.ValueFormat = format
			reg := prometheus.NewRegistry()
			s, err := New(cfg, nil, reg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			occs := sinktest.Hostile(format + "-")
			batch := make([]sinks.Record, 0, len(occs)+1)
			for i, o := range occs {
				batch = append(batch, sinks.Record{Offset: uint64(i + 1), Occurrence: o})
			}
			// One record that cannot fit even without its message: refused,
			// reported per record, the others still delivered.
			huge := sinktest.Hostile(format + "-huge-")[2]
			huge.Sandbox.Name = strings.Repeat("n", 2<<20)
			batch = append(batch, sinks.Record{Offset: 9, Occurrence: huge})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = s.Push(ctx, batch)
			var pe *sinks.PartialError
			if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[3] == nil {
				t.Fatalf("push = %v, want a PartialError refusing only the oversized record", err)
			}
			msgs, err := readTopic(ctx, nil, b.addr(), cfg.Topic)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != 3 {
				t.Fatalf("%d records in the topic, want 3", len(msgs))
			}
			for _, m := range msgs {
				if len(m.Key)+len(m.Value) > cfg.MaxMessageBytes {
					t.Errorf("record of %d bytes over max_message_bytes", len(m.Key)+len(m.Value))
				}
				var o eventpipev1.Occurrence
				if format == FormatOCSF {
					if err := decodeOCSF(m.Value, &o); err != nil {
						t.Fatal(err)
					}
				} else if format == FormatJSON {
					if !json.Valid(m.Value) {
						t.Fatalf("invalid JSON value for %s", header(m, "ce_id"))
					}
					if err := decodeJSON(m.Value, &o); err != nil {
						t.Fatal(err)
					}
				} else if err := proto.Unmarshal(m.Value, &o); err != nil {
					t.Fatalf("protobuf value: %v", err)
				}
				switch o.GetEventId() {
				case format + "-big-message":
					if !o.GetMessageTruncated() || len(o.GetMessage()) >= 1<<20 || len(o.GetMessage()) < 900_000 {
						t.Errorf("1 MiB message: truncated=%v, %d bytes kept", o.GetMessageTruncated(), len(o.GetMessage()))
					}
				case format + "-invalid-utf8":
					if o.GetMessage() != "bad\uFFFD\uFFFD\uFFFD(utf8" && o.GetMessage() != "bad\uFFFD(utf8" {
						t.Errorf("invalid UTF-8 became %q", o.GetMessage())
					}
				case format + "-injection":
					want := occs[2].GetMessage()
					if o.GetMessage() != want || o.GetSandbox().GetId() != want || string(m.Key) != want || header(m, "ce_subject") != want {
						t.Errorf("injection text altered: message %q key %q", o.GetMessage(), m.Key)
					}
				default:
					t.Errorf("unexpected record %q", o.GetEventId())
				}
			}
			if v := counterValue(t, reg, "eventpipe_sink_kafka_truncated_records_total"); v != 1 {
				t.Errorf("truncated counter = %v", v)
			}
		})
	}
}

// decodeOCSF reads an OCSF value back into an Occurrence (the subset this
// test checks).
func decodeOCSF(b []byte, o *eventpipev1.Occurrence) error {
	var v struct {
		Message  string `json:"message"`
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
		Unmapped struct {
			MessageTruncated bool `json:"message_truncated"`
			Sandbox          *struct {
				ID string `json:"id"`
			} `json:"sandbox"`
		} `json:"unmapped"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	o.EventId, o.Message, o.MessageTruncated = v.Metadata.UID, v.Message, v.Unmapped.MessageTruncated
	if v.Unmapped.Sandbox != nil {
		o.Sandbox = &eventpipev1.Sandbox{Id: v.Unmapped.Sandbox.ID}
	}
	return nil
}

// decodeJSON reads the documented JSON value back into an Occurrence (the
// subset this test checks).
func decodeJSON(b []byte, o *eventpipev1.Occurrence) error {
	var v struct {
		EventID          string `json:"event_id"`
		Message          string `json:"message"`
		MessageTruncated bool   `json:"message_truncated"`
		Sandbox          *struct {
			ID string `json:"id"`
		} `json:"sandbox"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&v); err != nil {
		return fmt.Errorf("decode value: %w", err)
	}
	o.EventId, o.Message, o.MessageTruncated = v.EventID, v.Message, v.MessageTruncated
	if v.Sandbox != nil {
		o.Sandbox = &eventpipev1.Sandbox{Id: v.Sandbox.ID}
	}
	return nil
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

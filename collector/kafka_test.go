package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
)

func startKafka(t *testing.T) *kfake.Cluster {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc
}

// kafkaConfig is testConfig in Kafka mode against kc: no store, no sinks.
func kafkaConfig(t *testing.T, kc *kfake.Cluster) Config {
	t.Helper()
	cfg := testConfig(t, t.TempDir())
	cfg.Store = NewDefaultConfig().Store
	cfg.Log = LogKafka
	bc := backbone.NewDefaultConfig()
	bc.Conn.Brokers = kc.ListenAddrs()
	bc.CreateTopics = true
	bc.Partitions = 6
	bc.ProduceTimeout = 3 * time.Second
	cfg.Backbone = &bc
	return cfg
}

// backboneRecords reads the backbone topic from the start until it holds
// at least want records or 10 s passed.
func backboneRecords(t *testing.T, cfg Config, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Backbone.Conn.Brokers...), kgo.ConsumeTopics(cfg.Backbone.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

func getCursor(t *testing.T, addr, cluster string) (*eventpipev1.GetCursorResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return eventpipev1.NewIngestClient(dial(t, addr, agentToken)).GetCursor(ctx, &eventpipev1.GetCursorRequest{Cluster: cluster})
}

// TestKafkaModeAckMeansInKafka: two replicas in Kafka mode; a batch
// acknowledged by one is in the backbone topic, the other replica answers
// GetCursor with its resourceVersion and serves Follow for it, and the
// replicas' file sinks (one consumer group) write every occurrence between
// them.
func TestKafkaModeAckMeansInKafka(t *testing.T) {
	kc := startKafka(t)
	cfg := kafkaConfig(t, kc)
	dir := t.TempDir()
	cfgA, cfgB := cfg, cfg
	cfgA.Sinks = []SinkConfig{fileSink("file", filepath.Join(dir, "a.jsonl"))}
	cfgB.Sinks = []SinkConfig{fileSink("file", filepath.Join(dir, "b.jsonl"))}
	a, b := startCollector(t, cfgA), startCollector(t, cfgB)
	if a.c.Store() != nil {
		t.Fatal("a local store was opened in Kafka mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var batches []*eventpipev1.Batch
	want := map[string]bool{}
	for i := range 20 {
		var os []*eventpipev1.Occurrence
		for j := range 10 {
			id := fmt.Sprintf("c1/u%d/%d", i*10+j, i)
			want[id] = true
			os = append(os, occ(id, fmt.Sprintf("sbx-%d", j%4), "ws1", "demo", "gw"))
		}
		batches = append(batches, batch(uint64(i+1), "c1", fmt.Sprint(1000+i), os...))
	}
	acks, err := ship(t, ctx, dial(t, a.c.GRPCAddr(), agentToken), batches...)
	if err != nil {
		t.Fatal(err)
	}
	if len(acks) != len(batches) {
		t.Fatalf("%d acks for %d batches", len(acks), len(batches))
	}
	for i, ack := range acks {
		if ack.GetSeq() != uint64(i+1) || ack.GetStored() != 10 || ack.GetDuplicates() != 0 {
			t.Errorf("ack %d: %v", i, ack)
		}
	}
	recs := backboneRecords(t, cfg, len(want))
	got := map[string]bool{}
	for _, r := range recs {
		got[backbone.EventID(r)] = true
		if backbone.Stream(r) != DefaultStream {
			t.Errorf("stream header %q", backbone.Stream(r))
		}
	}
	for id := range want {
		if !got[id] {
			t.Errorf("acknowledged %s is not in the backbone topic", id)
		}
	}
	resp, err := getCursor(t, b.c.GRPCAddr(), "c1")
	if err != nil || !resp.GetFound() || resp.GetResourceVersion() != "1019" {
		t.Fatalf("replica b GetCursor: %v %v, want 1019", resp, err)
	}
	if resp, err := getCursor(t, b.c.GRPCAddr(), "c2"); err != nil || resp.GetFound() {
		t.Fatalf("unknown cluster: %v %v", resp, err)
	}

	for _, r := range []*running{a, b} {
		res, err := http.Get("http://" + r.c.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("readyz %d: %s", res.StatusCode, body)
		}
	}
	if n := counterValue(t, a.reg, "eventpipe_collector_backbone_produced_records_total", map[string]string{"topic": "backbone"}); n != 200 {
		t.Errorf("produced records metric %v, want 200", n)
	}
	if n := counterValue(t, a.reg, "eventpipe_collector_backbone_produce_duration_seconds", map[string]string{"topic": "backbone"}); n == 0 {
		t.Error("no produce latency observed")
	}

	// Follow for one sandbox, from the replica that did not ingest.
	wantSbx := 0
	for _, b := range batches {
		for _, o := range b.GetOccurrences() {
			if o.GetSandbox().GetId() == "sbx-1" {
				wantSbx++
			}
		}
	}
	got2, err := follow(t, ctx, dial(t, b.c.GRPCAddr(), readerWS1), &eventpipev1.FollowRequest{SandboxId: "sbx-1", Tail: 1000, NoFollow: true}, 0)
	if err != nil || len(got2) != wantSbx {
		t.Errorf("Follow sbx-1 on replica b: %d occurrences (err %v), want %d", len(got2), err, wantSbx)
	}

	// The file sinks: one consumer group over both replicas.
	var inFiles map[string]int
	eventually(t, "every occurrence in one of the file sinks", func() bool {
		inFiles = readJSONL(t, filepath.Join(dir, "a.jsonl"))
		for id, n := range readJSONL(t, filepath.Join(dir, "b.jsonl")) {
			inFiles[id] += n
		}
		for id := range want {
			if inFiles[id] == 0 {
				return false
			}
		}
		return true
	})
	twice := 0
	for _, n := range inFiles {
		if n > 1 {
			twice++
		}
	}
	t.Logf("file sinks: %d event_ids, %d written more than once (a partition handed over between the replicas)", len(inFiles), twice)
}

// TestKafkaModeRefusedProduceIsNotAcknowledged: while Kafka refuses the
// backbone's records, no batch is acknowledged and the cursor stays.
func TestKafkaModeRefusedProduceIsNotAcknowledged(t *testing.T) {
	kc := startKafka(t)
	cfg := kafkaConfig(t, kc)
	cfg.Backbone.ProduceTimeout = time.Second
	a := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := dial(t, a.c.GRPCAddr(), agentToken)
	if _, err := ship(t, ctx, conn, batch(1, "c1", "10", occ("c1/a/1", "sbx-1", "ws1", "demo", "gw"))); err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	refuse.Store(true)
	kc.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	acks, err := ship(t, ctx, conn, batch(2, "c1", "20", occ("c1/b/1", "sbx-1", "ws1", "demo", "gw")))
	if len(acks) != 0 || status.Code(err) != codes.Unavailable {
		t.Fatalf("while Kafka refuses: acks %v, err %v; want none and Unavailable", acks, err)
	}
	refuse.Store(false)
	if resp, err := getCursor(t, a.c.GRPCAddr(), "c1"); err != nil || resp.GetResourceVersion() != "10" {
		t.Fatalf("cursor after the refused batch: %v %v, want 10", resp, err)
	}
	if n := counterValue(t, a.reg, "eventpipe_collector_backbone_produce_errors_total", map[string]string{"topic": "backbone"}); n < 1 {
		t.Errorf("produce errors %v", n)
	}
}

// TestKafkaModeMissingTopicRefusesStart: with create_topics off, a
// missing topic stops the collector at start with a message naming it.
func TestKafkaModeMissingTopicRefusesStart(t *testing.T) {
	kc := startKafka(t)
	cfg := kafkaConfig(t, kc)
	cfg.Backbone.CreateTopics = false
	_, err := New(cfg, testLogger(t), nil)
	if !errors.Is(err, backbone.ErrTopicMissing) || !strings.Contains(err.Error(), "eventpipe.occurrences") || !strings.Contains(err.Error(), "create_topics") {
		t.Fatalf("New: %v", err)
	}
}

// TestKafkaModeOversizedOccurrenceRefusedAlone: an occurrence too large
// for a backbone record is refused for good in the ack (too_large) and
// the rest of its batch is stored, as in local mode.
func TestKafkaModeOversizedOccurrenceRefusedAlone(t *testing.T) {
	kc := startKafka(t)
	cfg := kafkaConfig(t, kc)
	cfg.Backbone.MaxRecordBytes = 64 << 10
	a := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	big := occ("c1/big/1", "sbx-1", "ws1", "demo", "gw")
	big.Message = strings.Repeat("x", 60<<10)
	acks, err := ship(t, ctx, dial(t, a.c.GRPCAddr(), agentToken),
		batch(1, "c1", "7", occ("c1/ok/1", "sbx-1", "ws1", "demo", "gw"), big, occ("c1/ok/2", "sbx-2", "ws1", "demo", "gw")))
	if err != nil || len(acks) != 1 {
		t.Fatalf("acks %v, err %v", acks, err)
	}
	ack := acks[0]
	if ack.GetStored() != 2 || len(ack.GetRejected()) != 1 || ack.GetRejected()[0].GetReason() != "too_large" || ack.GetRejected()[0].GetIndex() != 1 {
		t.Fatalf("ack %v, want 2 stored and index 1 refused as too_large", ack)
	}
	got := map[string]bool{}
	for _, r := range backboneRecords(t, cfg, 2) {
		got[backbone.EventID(r)] = true
	}
	if !got["c1/ok/1"] || !got["c1/ok/2"] || got["c1/big/1"] {
		t.Fatalf("backbone holds %v", got)
	}
	if resp, err := getCursor(t, a.c.GRPCAddr(), "c1"); err != nil || resp.GetResourceVersion() != "7" {
		t.Fatalf("cursor %v %v, want 7", resp, err)
	}
}

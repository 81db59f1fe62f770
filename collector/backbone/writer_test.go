package backbone

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/store"
)

// newWriterCluster starts a three-broker kfake cluster, closed with the test.
func newWriterCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func testConfig(c *kfake.Cluster) Config {
	cfg := NewDefaultConfig()
	cfg.Conn.Brokers = c.ListenAddrs()
	cfg.CreateTopics = true
	cfg.Partitions = 6
	cfg.ProduceTimeout = 2 * time.Second
	return cfg
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newWriter(t *testing.T, cfg Config, reg prometheus.Registerer) *Writer {
	t.Helper()
	w, err := NewWriter(cfg, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.CheckTopics(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

func occs(cluster string, from, n int, sandboxes int) []*eventpipev1.Occurrence {
	out := make([]*eventpipev1.Occurrence, n)
	for i := range out {
		id := from + i
		out[i] = &eventpipev1.Occurrence{
			EventId: fmt.Sprintf("%s/uid-%d/%d", cluster, id, id), Cluster: cluster, Namespace: "openshell",
			Reason: "Pulling", Message: fmt.Sprintf("Pulling image %d", id),
			Sandbox: &eventpipev1.Sandbox{Id: fmt.Sprintf("sbx-%d", id%sandboxes)},
		}
	}
	return out
}

// readAll consumes topic from the start until it has want records (or
// the deadline passes) and returns them.
func wreadAll(t *testing.T, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// TestAppendIsInKafkaWhenItReturns: once Append returned nil, every
// occurrence of the batch is in the backbone topic, keyed by sandbox,
// in order per key, and the cursor is readable by another replica.
func TestAppendIsInKafkaWhenItReturns(t *testing.T) {
	c := newWriterCluster(t)
	cfg := testConfig(c)
	reg := prometheus.NewRegistry()
	a, b := newWriter(t, cfg, reg), newWriter(t, cfg, nil)
	ctx := context.Background()

	if _, ok, err := b.ClusterCursor(ctx, "c1", "events"); err != nil || ok {
		t.Fatalf("cursor before any write: ok=%v err=%v", ok, err)
	}
	batch := occs("c1", 0, 300, 7)
	res, err := a.Append(ctx, "c1", "events", "1000", batch)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stored != 300 || res.Duplicates != 0 {
		t.Fatalf("result %+v", res)
	}
	recs := wreadAll(t, cfg.Conn.Brokers, cfg.Topic, 300)
	if len(recs) != 300 {
		t.Fatalf("%d records in the topic, want 300", len(recs))
	}
	partOf := map[string]int32{}
	lastOfKey := map[string]int{}
	for _, r := range recs {
		o, err := Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		key := string(r.Key)
		if key != o.GetSandbox().GetId() {
			t.Errorf("key %q for sandbox %q", key, o.GetSandbox().GetId())
		}
		if p, ok := partOf[key]; ok && p != r.Partition {
			t.Errorf("key %s in partitions %d and %d", key, p, r.Partition)
		}
		partOf[key] = r.Partition
		var n int
		fmt.Sscanf(o.GetMessage(), "Pulling image %d", &n)
		if prev, ok := lastOfKey[key]; ok && n < prev {
			t.Errorf("key %s: occurrence %d after %d", key, n, prev)
		}
		lastOfKey[key] = n
	}
	// Another replica sees the cursor, and then the next one.
	if rv, ok, err := b.ClusterCursor(ctx, "c1", "events"); err != nil || !ok || rv != "1000" {
		t.Fatalf("replica b: cursor %q %v %v, want 1000", rv, ok, err)
	}
	if _, err := a.Append(ctx, "c1", "events", "1001", occs("c1", 300, 3, 7)); err != nil {
		t.Fatal(err)
	}
	if rv, _, err := b.ClusterCursor(ctx, "c1", "events"); err != nil || rv != "1001" {
		t.Fatalf("replica b after the second batch: %q %v", rv, err)
	}
	if _, ok, _ := b.ClusterCursor(ctx, "c2", "events"); ok {
		t.Error("cursor of an unknown cluster found")
	}
	if got := testutil.ToFloat64(a.m.produced.WithLabelValues(topicBackbone)); got != 303 {
		t.Errorf("produced records metric %v, want 303", got)
	}
}

// failProduceTo makes the brokers answer produce requests for topic with
// code while on is set.
func failProduceTo(t *testing.T, c *kfake.Cluster, topic string, code int16, on *atomic.Bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(context.Background(), topic)
	if err != nil || td[topic].Err != nil {
		t.Fatalf("topic id of %s: %v %v", topic, err, td[topic].Err)
	}
	id := td[topic].ID
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		hit := false
		for _, rt := range req.Topics {
			// Newer produce versions name topics by id only.
			hit = hit || rt.Topic == topic || rt.TopicID == id
		}
		if !on.Load() || !hit {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// TestCursorWrittenOnlyAfterItsBatch: a batch Kafka does not acknowledge
// fails Append and leaves the cursor where it was; a cursor Kafka does not
// acknowledge fails Append too (the agent re-sends the batch).
// With transactions, batch and cursor are one transaction: the refused
// cursor aborts the batch too.
func TestCursorWrittenOnlyAfterItsBatch(t *testing.T) {
	for _, txn := range []bool{false, true} {
		t.Run(fmt.Sprintf("transactions=%v", txn), func(t *testing.T) { testCursorAfterBatch(t, txn) })
	}
}

func testCursorAfterBatch(t *testing.T, txn bool) {
	c := newWriterCluster(t)
	cfg := testConfig(c)
	cfg.Transactions.Enabled = txn
	cfg.ProduceTimeout = 3 * time.Second
	w := newWriter(t, cfg, nil)
	ctx := context.Background()
	if _, err := w.Append(ctx, "c1", "events", "10", occs("c1", 0, 5, 2)); err != nil {
		t.Fatal(err)
	}

	var failBackbone, failCursor atomic.Bool
	failProduceTo(t, c, cfg.Topic, kerr.NotEnoughReplicas.Code, &failBackbone)
	failProduceTo(t, c, cfg.CursorTopic, kerr.NotEnoughReplicas.Code, &failCursor)

	failBackbone.Store(true)
	start := time.Now()
	if _, err := w.Append(ctx, "c1", "events", "20", occs("c1", 5, 5, 2)); err == nil {
		t.Fatal("Append returned nil while Kafka refused the batch")
	}
	if d := time.Since(start); d > 3*cfg.ProduceTimeout {
		t.Errorf("failed Append took %s, produce_timeout is %s", d, cfg.ProduceTimeout)
	}
	failBackbone.Store(false)
	if rv, _, err := w.ClusterCursor(ctx, "c1", "events"); err != nil || rv != "10" {
		t.Fatalf("cursor after a refused batch: %q %v, want 10", rv, err)
	}

	appendEventually(t, w, "", occs("c1", 100, 5, 2))
	failCursor.Store(true)
	if _, err := w.Append(ctx, "c1", "events", "30", occs("c1", 10, 5, 2)); err == nil || !strings.Contains(err.Error(), "cursor c1/events=30") {
		t.Fatalf("Append with the cursor refused: %v", err)
	}
	failCursor.Store(false)
	if rv, _, err := w.ClusterCursor(ctx, "c1", "events"); err != nil || rv != "10" {
		t.Fatalf("cursor after a refused cursor write: %q %v, want 10", rv, err)
	}
	appendEventually(t, w, "30", occs("c1", 10, 5, 2))
	if rv, _, err := w.ClusterCursor(ctx, "c1", "events"); err != nil || rv != "30" {
		t.Fatalf("cursor after the re-sent batch: %q %v, want 30", rv, err)
	}
	if got := testutil.ToFloat64(w.m.produceErrors.WithLabelValues(topicBackbone)); got < 1 {
		t.Errorf("backbone produce errors %v, want at least 1", got)
	}
}

// appendEventually re-sends a batch until Append takes it, as the agent
// does. After a failure the client also fails what it still buffered for
// the same partitions, so the first batch after Kafka recovered may fail.
func appendEventually(t *testing.T, w *Writer, rv string, batch []*eventpipev1.Occurrence) {
	t.Helper()
	var err error
	for range 5 {
		if _, err = w.Append(context.Background(), "c1", "events", rv, batch); err == nil {
			return
		}
	}
	t.Fatalf("Append still fails after Kafka recovered: %v", err)
}

func TestAppendRefusesOversizedOccurrence(t *testing.T) {
	c := newWriterCluster(t)
	cfg := testConfig(c)
	cfg.MaxRecordBytes = 64 << 10
	w := newWriter(t, cfg, nil)
	batch := occs("c1", 0, 3, 1)
	batch[1].Message = strings.Repeat("x", 60<<10)
	_, err := w.Append(context.Background(), "c1", "events", "5", batch)
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("err %v, want store.ErrInvalid", err)
	}
	if rv, ok, _ := w.ClusterCursor(context.Background(), "c1", "events"); ok {
		t.Fatalf("cursor %q written for a refused batch", rv)
	}
}

// TestTopicsMissing: without create_topics a missing topic is an error at
// start-up and on readiness; with it, both topics are created, the cursor
// topic compacted.
func TestTopicsMissing(t *testing.T) {
	c := newWriterCluster(t)
	cfg := testConfig(c)
	cfg.CreateTopics = false
	w, err := NewWriter(cfg, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = w.CheckTopics(ctx)
	if !errors.Is(err, ErrTopicMissing) || !strings.Contains(err.Error(), cfg.Topic) || !strings.Contains(err.Error(), cfg.CursorTopic) {
		t.Fatalf("CheckTopics: %v", err)
	}
	if err := w.Writable(); !errors.Is(err, ErrTopicMissing) {
		t.Fatalf("Writable: %v", err)
	}

	cfg.CreateTopics = true
	cfg.ReplicationFactor = 3
	w2 := newWriter(t, cfg, nil)
	if err := w2.Writable(); err != nil {
		t.Fatalf("Writable after creation: %v", err)
	}
	if err := w.Writable(); err != nil {
		t.Fatalf("first writer's Writable after creation: %v", err)
	}
	adm := kadm.NewClient(w2.prod)
	rc, err := adm.DescribeTopicConfigs(ctx, cfg.Topic, cfg.CursorTopic)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range rc {
		for _, c := range r.Configs {
			if c.Value != nil && (c.Key == "cleanup.policy" || c.Key == "min.insync.replicas") {
				got[r.Name+" "+c.Key] = *c.Value
			}
		}
	}
	want := map[string]string{
		cfg.CursorTopic + " cleanup.policy":      "compact",
		cfg.CursorTopic + " min.insync.replicas": "2",
		cfg.Topic + " min.insync.replicas":       "2",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	td, err := adm.ListTopics(ctx, cfg.Topic, cfg.CursorTopic)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(td[cfg.Topic].Partitions); n != cfg.Partitions {
		t.Errorf("backbone partitions %d, want %d", n, cfg.Partitions)
	}
	if n := len(td[cfg.CursorTopic].Partitions); n != 1 {
		t.Errorf("cursor partitions %d, want 1", n)
	}
}

func TestWritableWithoutBrokers(t *testing.T) {
	cfg := NewDefaultConfig()
	cfg.Conn.Brokers = []string{"127.0.0.1:1"}
	cfg.ProduceTimeout = time.Second
	w, err := NewWriter(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Writable(); err == nil {
		t.Fatal("writable with no broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.CheckTopics(ctx); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("CheckTopics: %v", err)
	}
	if _, _, err := w.ClusterCursor(ctx, "c1", "events"); err == nil {
		t.Fatal("ClusterCursor answered without brokers")
	}
}

// TestCreatorReadsCursorAtOnce: the replica that created the topics reads
// the cursor topic right away (its reader was built before the topic
// existed).
func TestCreatorReadsCursorAtOnce(t *testing.T) {
	c := newWriterCluster(t)
	w := newWriter(t, testConfig(c), nil)
	ctx := context.Background()
	if _, err := w.Append(ctx, "c1", "events", "42", occs("c1", 0, 1, 1)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rv, ok, err := w.ClusterCursor(ctx, "c1", "events")
	if err != nil || !ok || rv != "42" {
		t.Fatalf("cursor %q %v %v", rv, ok, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("first cursor read took %s", d)
	}
}

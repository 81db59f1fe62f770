package collector

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/kafka"
	"github.com/eventpipe/eventpipe/sinks/kafka/kafkatest"
	"github.com/eventpipe/eventpipe/sinks/loki"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

// The collector feeds all three sink types from its log, each through its
// own cursor: a file, a Kafka-protocol broker (kfake) and a Loki-protocol
// server (VictoriaLogs), all real.
func TestCollectorFeedsEverySinkType(t *testing.T) {
	const total = 300
	dir := t.TempDir()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	kc, err := kfake.NewCluster(kfake.Ports(port), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	vl := victorialogs.Start(t)

	cfg := testConfig(t, dir)
	jsonl := filepath.Join(dir, "events.jsonl")
	kcfg := kafka.NewDefaultConfig()
	kcfg.Conn.Brokers = []string{fmt.Sprintf("127.0.0.1:%d", port)}
	kcfg.Topic = "eventpipe.test"
	// The topic exists before the first push (no auto-creation race with
	// the first produce), and a failed push is retried within a second, so
	// a busy machine delays delivery by seconds, not by the 30 s backoff
	// ceiling.
	kcfg.CreateTopic = kafka.CreateTopicConfig{Enabled: true, Partitions: 3, ReplicationFactor: 1}
	lcfg := loki.NewDefaultConfig()
	lcfg.URL = vl.PushURL()
	d := sinks.NewDefaultRunnerConfig("")
	d.Batch.MaxWait = 50 * time.Millisecond
	d.Retry.Max = time.Second
	cfg.Sinks = []SinkConfig{
		fileSink("archive", jsonl),
		{Name: "kafka", Type: SinkKafka, Kafka: &kcfg, Batch: d.Batch, Retry: d.Retry},
		{Name: "loki", Type: SinkLoki, Loki: &lcfg, Batch: d.Batch, Retry: d.Retry},
	}
	r := startCollector(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	gen := sinktest.NewGenerator(7, "all-sinks-")
	var bs []*eventpipev1.Batch
	for i := range total / 50 {
		bs = append(bs, batch(uint64(i+1), sinktest.SeedCluster, fmt.Sprint(i+1), gen.Batch(50)...))
	}
	if _, err := ship(t, ctx, dial(t, r.c.GRPCAddr(), agentToken), bs...); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the file sink", func() bool { return len(readJSONL(t, jsonl)) == total })
	var msgs []*kgo.Record
	deadline := time.Now().Add(60 * time.Second)
	for {
		msgs, err = readKafkaTopic(ctx, kcfg.Conn.Brokers[0], kcfg.Topic)
		if err == nil && len(msgs) >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(msgs) < total {
		for _, rn := range r.c.Runners() {
			t.Logf("runner %+v", rn.Status())
		}
		t.Fatalf("kafka topic has %d messages (%v), want %d", len(msgs), err, total)
	}
	rows, err := vl.WaitFor(ctx, "*", total)
	if err != nil || len(rows) < total {
		t.Fatalf("VictoriaLogs has %d entries (%v), want %d", len(rows), err, total)
	}
	// Every runner's cursor reached the end of the log.
	eventually(t, "every cursor at the head", func() bool {
		for _, rn := range r.c.Runners() {
			if st := rn.Status(); st.Cursor != total {
				return false
			}
		}
		return true
	})
}

func readKafkaTopic(ctx context.Context, addr, topic string) ([]*kgo.Record, error) {
	return kafkatest.ReadTopic(ctx, []kgo.Opt{kgo.SeedBrokers(addr)}, topic)
}

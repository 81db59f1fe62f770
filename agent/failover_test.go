package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eventpipe/eventpipe/collector"
	"github.com/eventpipe/eventpipe/collector/backbone"
)

// startKafkaCollector runs an in-process collector replica with log: kafka
// against the brokers.
func startKafkaCollector(t testing.TB, brokers []string) *testCollector {
	t.Helper()
	cfg := collector.NewDefaultConfig()
	cfg.GRPC.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.GRPC.ShutdownGrace = 2 * time.Second
	cfg.Auth.Insecure = true
	cfg.Log = collector.LogKafka
	bc := backbone.NewDefaultConfig()
	bc.Conn.Brokers = brokers
	bc.CreateTopics = true
	bc.Partitions = 6
	bc.ProduceTimeout = 5 * time.Second
	cfg.Backbone = &bc
	reg := prometheus.NewRegistry()
	c, err := collector.New(cfg, testLogger(t), reg)
	if err != nil {
		t.Fatalf("collector.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testCollector{c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { tc.done <- c.Run(ctx) }()
	t.Cleanup(func() { tc.stop(t) })
	return tc
}

// backboneEventIDs reads the whole backbone topic and counts the records
// of each event_id in namespace ns.
func backboneEventIDs(t testing.TB, brokers []string, topic, ns string) (map[string]int, int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Read until three polls in a row bring nothing.
	out := map[string]int{}
	records := 0
	idle := 0
	for ctx.Err() == nil && idle < 3 {
		fctx, fcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(fctx)
		fcancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			o, err := backbone.Decode(r)
			if err != nil || o.GetNamespace() != ns {
				return
			}
			out[o.GetEventId()]++
			records++
		})
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	return out, records
}

// waitAllInTopic waits until every occurrence g created is in the
// backbone topic, and returns how many records each has there.
func waitAllInTopic(t *testing.T, brokers []string, g *loadGen, within time.Duration) (map[string]int, int) {
	t.Helper()
	want := g.created()
	var got map[string]int
	var records int
	waitFor(t, within, "every created Event in the backbone topic", func() (bool, string) {
		got, records = backboneEventIDs(t, brokers, backbone.DefaultTopic, g.ns)
		missing := 0
		var first string
		for id := range want {
			if got[id] == 0 {
				missing++
				first = id
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d missing (e.g. %s)", missing, len(want), first)
	})
	for id := range got {
		if !want[id] {
			t.Errorf("occurrence %s in the topic was never created", id)
		}
	}
	return got, records
}

// TestAgentFailsOverToAnotherCollector: an agent given two collector
// replicas (collector.addresses, Kafka mode) keeps shipping when the one
// it talks to goes away: Events created afterwards reach the backbone
// topic through the other, and the agent does not relist.
func TestAgentFailsOverToAnotherCollector(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	cols := []*testCollector{startKafkaCollector(t, brokers), startKafkaCollector(t, brokers)}

	cfg := testConfig("failover", "")
	cfg.Collector.Addresses = []string{cols[0].addr(), cols[1].addr()}
	cfg.Hold.MaxAge = time.Second
	cfg.Ship.BackoffInitial = 100 * time.Millisecond
	ra := startAgent(t, cfg)
	waitFor(t, 60*time.Second, "agent ready", func() (bool, string) { return ra.a.Ready() == nil, fmt.Sprint(ra.a.Ready()) })

	g := newLoadGen(t, "failover")
	ctx := context.Background()
	if err := g.run(ctx, 100, 200, 4); err != nil {
		t.Fatal(err)
	}
	waitAllInTopic(t, brokers, g, 60*time.Second)

	// Stop the replica the agent ships to; the other takes over.
	batches := func(tc *testCollector) float64 {
		return counter(t, tc.reg, "eventpipe_collector_ingest_batches_total", nil)
	}
	active, other := cols[0], cols[1]
	if batches(other) > batches(active) {
		active, other = other, active
	}
	before := batches(other)
	active.stop(t)
	if err := g.run(ctx, 100, 200, 4); err != nil {
		t.Fatal(err)
	}
	got, records := waitAllInTopic(t, brokers, g, 60*time.Second)
	if batches(other) <= before {
		t.Errorf("the remaining replica received no batch after the failover")
	}
	if n := counter(t, ra.reg, "eventpipe_agent_relists_total", nil); n != 1 {
		t.Errorf("agent relisted %v times, want 1 (its start only)", n)
	}
	t.Logf("%d Events created, %d distinct in the topic, %d records", len(g.created()), len(got), records)
}

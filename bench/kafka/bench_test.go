package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/backbone"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// BenchmarkWriterAppend is the write path of Kafka mode without gRPC: one
// backbone.Writer.Append of a 500-occurrence batch (records and the
// stream's cursor, both acks=all) into a three-broker kfake cluster,
// batches one after another. b.N counts occurrences.
//
//	go test -run '^$' -bench WriterAppend -benchtime 100000x -count 3 ./bench/kafka
func BenchmarkWriterAppend(b *testing.B) {
	const batch = 500
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	cfg := backbone.NewDefaultConfig()
	cfg.Conn.Brokers = c.ListenAddrs()
	cfg.CreateTopics = true
	w, err := backbone.NewWriter(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.CheckTopics(ctx); err != nil {
		b.Fatal(err)
	}
	gen := sinktest.NewGenerator(1, "")
	pool := make([][]*eventpipev1.Occurrence, 8)
	for i := range pool {
		pool[i] = gen.Batch(batch)
	}
	b.ResetTimer()
	cpu0 := sinktest.CPUTime()
	for n := 0; n*batch < b.N; n++ {
		occs := pool[n%len(pool)]
		for i, o := range occs {
			o.EventId = fmt.Sprintf("b/%d/%d", n, i)
		}
		if _, err := w.Append(context.Background(), "bench", "events", fmt.Sprint(n+1), occs); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "occ/s")
	b.ReportMetric(float64((sinktest.CPUTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/occ")
}

package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// BenchmarkKafkaSink measures occurrences/s from the log through a Runner
// and the Sink into an in-process kfake broker (acks=all, snappy), by
// runner batch size. kfake is in-memory: the figure bounds the sink's own
// cost, not a real cluster's throughput.
func BenchmarkKafkaSink(b *testing.B) {
	for _, tc := range []struct {
		batch       int
		compression string
	}{{100, CompressionSnappy}, {500, CompressionSnappy}, {1000, CompressionSnappy}, {1000, CompressionZstd}, {1000, CompressionNone}} {
		b.Run(fmt.Sprintf("batch=%d/%s", tc.batch, tc.compression), func(b *testing.B) {
			br := startMemBroker(b)
			cfg := testConfig(br.addr(), "bench")
			cfg.Compression = tc.compression
			cfg.CreateTopic.Partitions = 6
			s, err := New(cfg, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			l := sinktest.NewMemLog()
			g := sinktest.NewGenerator(31, "bench-")
			g.Sandboxes = 200
			if err := l.Append(context.Background(), g.Batch(b.N)); err != nil {
				b.Fatal(err)
			}
			rc := sinks.NewDefaultRunnerConfig("kafka")
			rc.Batch.MaxRecords = tc.batch
			rc.Batch.MaxWait = 50 * time.Millisecond
			st := sinktest.BenchDrain(b, rc, s, l)
			_ = s.Close()
			if st.Failed != 0 || st.Sent != uint64(b.N) {
				b.Fatalf("status %+v", st)
			}
		})
	}
}

// BenchmarkEncode is the encoding cost per occurrence (key, value,
// CloudEvents headers), which must stay far below the collector's ingest
// budget (50,000/s = 20 µs per occurrence).
func BenchmarkEncode(b *testing.B) {
	occs := sinktest.NewGenerator(41, "enc-").Batch(1024)
	for _, format := range []string{FormatJSON, FormatProtobuf} {
		b.Run(format, func(b *testing.B) {
			e := encoder{format: format, source: DefaultSource, maxBytes: DefaultMaxMessageBytes}
			var bytes int
			b.ReportAllocs()
			cpu0 := sinktest.CPUTime()
			for i := 0; b.Loop(); i++ {
				if i%len(occs) == 0 { // one push of 1024 records
					e.finish(len(occs), true)
					e.start(len(occs))
				}
				m, _, _, err := e.encode(occs[i%len(occs)])
				if err != nil {
					b.Fatal(err)
				}
				bytes += len(m.Value)
			}
			b.ReportMetric(float64((sinktest.CPUTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(bytes)/float64(b.N), "value-bytes/op")
		})
	}
	// Baseline on the same machine and load: generic protojson.
	b.Run("protojson-baseline", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := sinktest.CPUTime()
		for i := 0; b.Loop(); i++ {
			if _, err := protojson.Marshal(occs[i%len(occs)]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((sinktest.CPUTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}

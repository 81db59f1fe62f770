package collector

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// BenchmarkShip measures ingest-to-acknowledge over gRPC on loopback with
// the log fsyncing: one op = one occurrence. The end-to-end harness with
// latency percentiles and fan-out is bench/collector (bench/collector.md).
func BenchmarkShip(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			cfg := testConfig(b, b.TempDir())
			r := startCollector(b, cfg)
			conn := dial(b, r.c.GRPCAddr(), agentToken)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			st, err := eventpipev1.NewIngestClient(conn).Ship(ctx)
			if err != nil {
				b.Fatal(err)
			}
			pool := sinktest.NewGenerator(1, "").Batch(size)
			batches := (b.N + size - 1) / size
			window := make(chan struct{}, cfg.GRPC.IngestPipeline)
			done := make(chan error, 1)
			go func() {
				for range batches {
					if _, err := st.Recv(); err != nil {
						done <- err
						return
					}
					<-window
				}
				done <- nil
			}()
			b.ResetTimer()
			for n := 1; n <= batches; n++ {
				window <- struct{}{}
				for i, o := range pool {
					o.EventId = fmt.Sprintf("bench-%d-%d", n, i)
				}
				if err := st.Send(&eventpipev1.Batch{Seq: uint64(n), Cluster: "bench", ResourceVersion: fmt.Sprint(n), Occurrences: pool}); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			st.CloseSend()
			b.ReportMetric(float64(batches*size)/b.Elapsed().Seconds(), "occurrences/s")
		})
	}
}

package file

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
)

// BenchmarkFileSink measures occurrences/s from the log through a Runner
// and the file sink (encode, write, fsync per push, rotation at 100 MiB).
func BenchmarkFileSink(b *testing.B) {
	for _, batch := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			cfg := NewDefaultConfig()
			cfg.Path = filepath.Join(b.TempDir(), "events.jsonl")
			s, err := New(cfg, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			l := sinktest.NewMemLog()
			if err := l.Append(context.Background(), sinktest.NewGenerator(51, "fb-").Batch(b.N)); err != nil {
				b.Fatal(err)
			}
			cur, _ := l.Cursor("file")
			rc := sinks.NewDefaultRunnerConfig("file")
			rc.Batch.MaxRecords = batch
			r, err := sinks.NewRunner(rc, s, l, cur, nil, prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ResetTimer()
			start, cpu0 := time.Now(), cpuTime()
			go func() { done <- r.Run(ctx) }()
			for r.Status().Cursor < uint64(b.N) {
				time.Sleep(200 * time.Microsecond)
			}
			el, cpu := time.Since(start), cpuTime()-cpu0
			b.StopTimer()
			cancel()
			<-done
			_ = s.Close()
			b.ReportMetric(float64(b.N)/el.Seconds(), "occ/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/occ")
		})
	}
}

// cpuTime is the process's user + system CPU time (all threads, GC
// included): on a shared, loaded machine it is steadier than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

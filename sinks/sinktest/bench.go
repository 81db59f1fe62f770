package sinktest

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eventpipe/eventpipe/sinks"
)

// CPUTime is this process's user + system CPU time (every thread, GC
// included): on a shared, loaded machine CPU per record is steadier than
// wall-clock rates. 0 when getrusage fails.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchDrain is the body of a sink benchmark: a Runner (rc) pushing to p
// reads the log l, which holds b.N records from offset 1, until it has
// handled them all (Status.Handled: the cursor itself is committed only
// once per commit_interval). The timer covers only that; occ/s and cpu-ns/occ are
// reported on b, and the runner's final status returned for the caller's
// checks. The caller closes p.
func BenchDrain(b *testing.B, rc sinks.RunnerConfig, p sinks.Pusher, l *MemLog) sinks.Status {
	b.Helper()
	cur, err := l.Cursor(rc.Name)
	if err != nil {
		b.Fatal(err)
	}
	r, err := sinks.NewRunner(rc, p, l, cur, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ResetTimer()
	start, cpu0 := time.Now(), CPUTime()
	go func() { done <- r.Run(ctx) }()
	for r.Status().Handled < uint64(b.N) {
		time.Sleep(200 * time.Microsecond)
	}
	el, cpu := time.Since(start), CPUTime()-cpu0
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatalf("runner: %v", err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "occ/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/occ")
	return r.Status()
}

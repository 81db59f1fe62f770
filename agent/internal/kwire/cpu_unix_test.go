//go:build unix

package kwire

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the process's user+system CPU time: on this shared machine
// it is steadier than wall time per op, which includes waiting for a core.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU starts measuring; the returned func reports cpu-ns/op (GC work
// on other threads included: it is part of the cost).
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

package wal

import (
	"bytes"
	"fmt"
	"testing"
)

// BenchmarkAppendFsync is the floor under the store's latency: one Append
// (one write + one fsync) of n 650-byte records, one caller, on this disk.
func BenchmarkAppendFsync(b *testing.B) {
	for _, n := range []int{1, 100, 500} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			w, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			recs := make([][]byte, n)
			for i := range recs {
				recs[i] = bytes.Repeat([]byte{byte(i)}, 650)
			}
			b.SetBytes(int64(n * 650))
			for b.Loop() {
				if _, _, err := w.Append(recs); err != nil {
					b.Fatal(err)
				}
			}
			count, secs := w.m.FsyncStats()
			b.ReportMetric(secs/float64(count)*1000, "fsync-ms")
		})
	}
}

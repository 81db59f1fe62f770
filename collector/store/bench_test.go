package store

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

// BenchmarkAppend measures ingest-to-durable: realistic ~600-byte
// occurrences, fsync on, batches of 100 and 500, 1 and 8 concurrent
// appenders (8 appenders = 8 agent streams sharing group commits). One op
// is one Append of one batch. Reported: occ/s, p50/p99 Append latency,
// fsyncs per batch and the mean fsync time.
func BenchmarkAppend(b *testing.B) {
	if size := len(mustMarshalB(b)); size < 500 || size > 800 {
		b.Fatalf("fixture is %d bytes", size)
	}
	for _, batch := range []int{100, 500} {
		for _, appenders := range []int{1, 8} {
			b.Run(fmt.Sprintf("batch=%d/appenders=%d", batch, appenders), func(b *testing.B) {
				benchAppend(b, batch, appenders, true)
			})
		}
	}
}

// BenchmarkAppendNoFsync is the same load with fsync off, to show what
// durability costs on this disk (fsync=false is not a production setting).
func BenchmarkAppendNoFsync(b *testing.B) {
	for _, batch := range []int{100, 500} {
		for _, appenders := range []int{1, 8} {
			b.Run(fmt.Sprintf("batch=%d/appenders=%d", batch, appenders), func(b *testing.B) {
				benchAppend(b, batch, appenders, false)
			})
		}
	}
}

func mustMarshalB(b *testing.B) []byte {
	out, err := proto.Marshal(occ(1))
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func benchAppend(b *testing.B, batch, appenders int, fsync bool) {
	cfg := testConfig(b.TempDir())
	cfg.Fsync = fsync
	s := mustOpen(b, cfg, options{})
	var next atomic.Int64
	lats := make([][]time.Duration, appenders)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			occs := occs(0, batch)
			cluster := fmt.Sprintf("bench-%d", g)
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				for i, o := range occs {
					o.EventId = fmt.Sprintf("%s/%d/%d", cluster, n, i)
				}
				t0 := time.Now()
				_, err := s.Append(context.Background(), cluster, "events", fmt.Sprint(n), occs)
				lats[g] = append(lats[g], time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000
	}
	n, sum := s.walm.FsyncStats()
	fsyncs := float64(n)
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "occ/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	if fsyncs > 0 {
		b.ReportMetric(fsyncs/float64(b.N), "fsyncs/op")
		b.ReportMetric(sum/fsyncs*1000, "fsync-ms")
	}
}

// BenchmarkRead measures a sink catching up: sequential Reads of 500
// records (decode included) from a log of 20,000 occurrences.
func BenchmarkRead(b *testing.B) {
	cfg := testConfig(b.TempDir())
	cfg.Fsync = false
	s := mustOpen(b, cfg, options{})
	ctx := context.Background()
	for k := range 40 {
		if _, err := s.Append(ctx, "c", "events", "", occs(k*500, 500)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	read := 0
	for b.Loop() {
		for from := uint64(1); ; {
			recs, _, err := s.Read(ctx, from, 500)
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			read += len(recs)
			from = recs[len(recs)-1].Offset + 1
		}
	}
	b.ReportMetric(float64(read)/b.Elapsed().Seconds(), "records/s")
}

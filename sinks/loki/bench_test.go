package loki

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
	"github.com/eventpipe/eventpipe/sinks/sinktest"
	"github.com/eventpipe/eventpipe/testenv/victorialogs"
)

var benchBatches = []int{100, 500, 1000}

func benchRecords(n int) []sinks.Record {
	gen := sinktest.NewGenerator(42, "bench-")
	occs := gen.Batch(n)
	// Recent times, as in steady operation (no re-stamping).
	now := time.Now()
	for i, o := range occs {
		o.OccurredAt.Seconds = now.Add(-time.Duration(n-i) * time.Millisecond).Unix()
	}
	return records(occs...)
}

// BenchmarkEncode measures everything Push does before the HTTP request:
// line, labels, metadata, grouping, protobuf (or JSON) and snappy.
func BenchmarkEncode(b *testing.B) {
	for _, enc := range []string{EncodingProtobuf, EncodingJSON} {
		for _, n := range benchBatches {
			b.Run(fmt.Sprintf("%s/batch=%d", enc, n), func(b *testing.B) {
				cfg := NewDefaultConfig()
				cfg.Encoding = enc
				s, err := New(cfg, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				batch := benchRecords(n)
				now := time.Now()
				var bodyBytes int
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := sinktest.CPUTime()
				for i := 0; i < b.N; i++ {
					failed := map[int]error{}
					bp, rawp, zp := s.getBuf(), s.getBuf(), s.getBuf()
					var entries []entry
					entries, *bp = s.build(batch, now, (*bp)[:0], failed)
					ptrs := make([]*entry, len(entries))
					for j := range entries {
						ptrs[j] = &entries[j]
					}
					body, _ := s.encode(ptrs, rawp, zp)
					bodyBytes = len(body)
					s.putBuf(bp)
					s.putBuf(rawp)
					s.putBuf(zp)
				}
				cpu := sinktest.CPUTime() - cpu0
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "occ/s")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/occ")
				b.ReportMetric(float64(bodyBytes)/float64(n), "B/occ")
			})
		}
	}
}

// BenchmarkPushVictoriaLogs measures Push end to end into a real
// VictoriaLogs on loopback (encode, HTTP, server ingest).
func BenchmarkPushVictoriaLogs(b *testing.B) {
	vl := victorialogs.Start(b)
	for _, n := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			s := newVLSink(b, vl, nil)
			batch := benchRecords(n)
			b.ResetTimer()
			cpu0, srv0 := sinktest.CPUTime(), vl.CPUTime()
			for i := 0; i < b.N; i++ {
				if err := s.Push(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, n, cpu0)
			b.ReportMetric(float64((vl.CPUTime()-srv0).Nanoseconds())/float64(b.N*n), "server-cpu-ns/occ")
		})
	}
}

// BenchmarkRunnerVictoriaLogs measures the sustained rate from a log
// through the shared runner into VictoriaLogs: 20,000 occurrences per
// iteration, preloaded, drained by one runner.
func BenchmarkRunnerVictoriaLogs(b *testing.B) {
	const total = 20_000
	vl := victorialogs.Start(b)
	for _, n := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			recs := benchRecords(total)
			var cpuAll, srvAll time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				log := sinktest.NewMemLog()
				for j := 0; j < total; j += 1000 {
					occs := make([]*eventpipev1.Occurrence, 0, 1000)
					for _, r := range recs[j:min(j+1000, total)] {
						occs = append(occs, r.Occurrence)
					}
					if err := log.Append(context.Background(), occs); err != nil {
						b.Fatal(err)
					}
				}
				cur, _ := log.Cursor("loki")
				rc := sinks.NewDefaultRunnerConfig("loki")
				rc.Batch.MaxRecords = n
				rc.Batch.MaxWait = 10 * time.Millisecond
				s := newVLSink(b, vl, nil)
				r, err := sinks.NewRunner(rc, s, log, cur, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				b.StartTimer()
				cpu0, srv0 := sinktest.CPUTime(), vl.CPUTime()
				go func() { done <- r.Run(ctx) }()
				for r.Status().Cursor < total {
					time.Sleep(time.Millisecond)
				}
				cpuAll += sinktest.CPUTime() - cpu0
				srvAll += vl.CPUTime() - srv0
				b.StopTimer()
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				if st := r.Status(); st.Failed != 0 || st.Sent != total {
					b.Fatalf("status %+v", st)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*total)/b.Elapsed().Seconds(), "occ/s")
			b.ReportMetric(float64(cpuAll.Nanoseconds())/float64(b.N*total), "client-cpu-ns/occ")
			b.ReportMetric(float64(srvAll.Nanoseconds())/float64(b.N*total), "server-cpu-ns/occ")
		})
	}
}

// reportRates reports occurrences/s and this process's CPU per occurrence
// (the sink's side; the server runs in its own process).
func reportRates(b *testing.B, perOp int, cpu0 time.Duration) {
	cpu := sinktest.CPUTime() - cpu0
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "occ/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*perOp), "client-cpu-ns/occ")
}

// BenchmarkPushDiscard is Push over real HTTP on loopback to a server that
// reads the body and answers 204: the sink's ceiling without a storage
// engine behind it.
func BenchmarkPushDiscard(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	for _, n := range benchBatches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			cfg := NewDefaultConfig()
			cfg.URL = srv.URL
			s, err := New(cfg, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			batch := benchRecords(n)
			b.ResetTimer()
			cpu0 := sinktest.CPUTime()
			for i := 0; i < b.N; i++ {
				if err := s.Push(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, n, cpu0)
		})
	}
}

// BenchmarkLine measures the line alone (appendLine), the part of Push that
// encodes an occurrence's fields.
func BenchmarkLine(b *testing.B) {
	recs := benchRecords(1024)
	buf := make([]byte, 0, 8192)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf = appendLine(buf[:0], recs[i%len(recs)].Occurrence, DefaultMaxMessageBytes)
	}
}

package file

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

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
			rc := sinks.NewDefaultRunnerConfig("file")
			rc.Batch.MaxRecords = batch
			sinktest.BenchDrain(b, rc, s, l)
			_ = s.Close()
		})
	}
}

// BenchmarkOpenReadBack measures New on a file holding a full default
// resend window of lines: the start-up cost of reading their event_ids
// back.
func BenchmarkOpenReadBack(b *testing.B) {
	cfg := NewDefaultConfig()
	cfg.Path = filepath.Join(b.TempDir(), "events.jsonl")
	s, err := New(cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	gen := sinktest.NewGenerator(52, "rb-")
	for n := 0; n < DefaultResendWindow; n += 1000 {
		var batch []sinks.Record
		for i, o := range gen.Batch(1000) {
			batch = append(batch, sinks.Record{Offset: uint64(n + i + 1), Occurrence: o})
		}
		if err := s.Push(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
	_ = s.Close()
	b.ResetTimer()
	for range b.N {
		s, err := New(cfg, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		_ = s.Close()
	}
}

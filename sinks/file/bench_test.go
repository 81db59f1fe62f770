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

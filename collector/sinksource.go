package collector

import (
	"context"

	"github.com/eventpipe/eventpipe/collector/store"
	"github.com/eventpipe/eventpipe/sinks"
)

// sinkSource is the sinks.Source every sink runner of a collector reads:
// the durable log through one chunkCache shared by all runners, so N sinks
// that follow the log at about the same place read and decode each record
// once instead of N times. A runner far behind the others (an outage being
// caught up) misses the cache and reads the log itself, as before.
//
// The records it returns are shared between runners: sinks.Pusher and the
// runner's filter only read them.
type sinkSource struct {
	cache *chunkCache
	log   followLog
}

var _ sinks.Source = sinkSource{}

// sinkReadChunk and sinkCacheChunks size the runners' cache: chunks of 1024
// records, the last 8 kept (at most 8192 decoded records besides what the
// runners' own batches hold).
const (
	sinkReadChunk   = 1024
	sinkCacheChunks = 8
)

func newSinkSource(log followLog) sinkSource {
	return sinkSource{cache: newChunkCache(log, sinkReadChunk, sinkCacheChunks), log: log}
}

// Read returns up to max records with Offset >= from (at most the rest of
// one chunk); skipped counts records removed by retention before they were
// read.
func (s sinkSource) Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	return s.cache.readMax(ctx, from, max)
}

// Wait is the log's Wait.
func (s sinkSource) Wait(ctx context.Context, after uint64) error { return s.log.Wait(ctx, after) }

// Bounds is the log's Bounds: a runner checks its committed cursor against
// it (offsets a repair skipped were assigned, so a cursor up to there is
// not beyond the log).
func (s sinkSource) Bounds() (first, last uint64) { return s.log.Bounds() }

// LastOffset is the offset of the log's newest record (sinks.SourceHead):
// a runner's lag counts the records it has not handled, and offsets a
// repair skipped at the end of the log hold none, so they are no lag.
func (s sinkSource) LastOffset() uint64 { return lastRecord(s.log) }

// lastRecord is the newest record's offset of a log that knows it (the
// store), else the last offset of its Bounds.
func lastRecord(log followLog) uint64 {
	if l, ok := log.(interface{ LastRecord() uint64 }); ok {
		return l.LastRecord()
	}
	_, last := log.Bounds()
	return last
}

// SinkLog is what SinkSource reads: the collector's store (*store.Store),
// or a wrapper of it.
type SinkLog interface {
	Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error)
	Wait(ctx context.Context, after uint64) error
	Bounds() (first, last uint64)
}

var _ SinkLog = (*store.Store)(nil)

// SinkSource returns the Source the collector's sink runners read: the log
// through one chunk cache shared by every runner given the same Source.
// bench/sinks uses it to run sinks the way the collector does.
func SinkSource(log SinkLog) sinks.Source { return newSinkSource(log) }

package collector

import (
	"context"
	"sync"

	"github.com/eventpipe/eventpipe/sinks"
)

// chunkCache lets follow subscribers that read the same part of the log
// share one read and decode: records are read in chunks aligned to
// multiples of the chunk size and the last few chunks are kept. A fan-out
// of N live subscribers then costs one decode per record instead of N.
// Memory is bounded by maxEntries chunks. The records are shared and must
// be treated as read-only (gRPC only marshals them).
type chunkCache struct {
	log        followLog
	chunk      uint64
	maxEntries int

	mu      sync.Mutex
	entries map[uint64]*chunkEntry
	order   []uint64 // aligned starts, oldest first
}

type chunkEntry struct {
	done chan struct{}
	ok   bool
	recs []sinks.Record
}

func (e *chunkEntry) last() uint64 {
	if len(e.recs) == 0 {
		return 0
	}
	return e.recs[len(e.recs)-1].Offset
}

func newChunkCache(log followLog, chunk, maxEntries int) *chunkCache {
	return &chunkCache{log: log, chunk: uint64(chunk), maxEntries: maxEntries, entries: map[uint64]*chunkEntry{}}
}

// Read has the contract of sinks.Source.Read with max = the chunk size:
// records with Offset >= from, in order; skipped counts records removed by
// retention in [from, first returned).
func (c *chunkCache) Read(ctx context.Context, from uint64) ([]sinks.Record, uint64, error) {
	if from == 0 {
		from = 1
	}
	first, last := c.log.Bounds()
	if from > last || from < first {
		// Nothing new yet (the caller will Wait), or behind retention (the
		// log reports the loss): no caching.
		return c.log.Read(ctx, from, int(c.chunk))
	}
	start := (from-1)/c.chunk*c.chunk + 1
	want := min(last, start+c.chunk-1)
	c.mu.Lock()
	e := c.entries[start]
	if e != nil {
		select {
		case <-e.done:
			if !e.ok || e.last() < want {
				e = nil // stale (the chunk has grown) or failed: read again
			}
		default: // being read by another subscriber: share it
		}
	}
	leader := false
	if e == nil {
		e = &chunkEntry{done: make(chan struct{})}
		c.put(start, e)
		leader = true
	}
	c.mu.Unlock()

	if leader {
		recs, skipped, err := c.log.Read(ctx, start, int(c.chunk))
		e.ok = err == nil && skipped == 0 && len(recs) > 0 && recs[0].Offset == start
		if e.ok {
			e.recs = recs
		}
		close(e.done)
	} else {
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	if !e.ok || e.last() < from {
		return c.log.Read(ctx, from, int(c.chunk))
	}
	i := int(from - start) // offsets are dense within a chunk
	if i >= len(e.recs) || e.recs[i].Offset != from {
		return c.log.Read(ctx, from, int(c.chunk))
	}
	return e.recs[i:], 0, nil
}

// put stores e under start, dropping the oldest chunks beyond maxEntries.
// c.mu is held.
func (c *chunkCache) put(start uint64, e *chunkEntry) {
	if _, ok := c.entries[start]; ok {
		for i, s := range c.order {
			if s == start {
				c.order = append(c.order[:i], c.order[i+1:]...)
				break
			}
		}
	}
	c.entries[start] = e
	c.order = append(c.order, start)
	for len(c.order) > c.maxEntries {
		delete(c.entries, c.order[0])
		c.order = c.order[1:]
	}
}

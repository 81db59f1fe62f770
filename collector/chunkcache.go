package collector

import (
	"context"
	"sync"

	"github.com/eventpipe/eventpipe/sinks"
)

// chunkCache lets readers of the same part of the log share one read and
// decode: records are read in chunks aligned to multiples of the chunk size
// and the last few chunks are kept. A fan-out of N live readers (follow
// subscribers, sink runners) then costs one decode per record instead of N.
// Memory is bounded by maxEntries chunks. The records are shared and must
// be treated as read-only (gRPC only marshals them; sinks.Pusher promises
// not to modify its batch).
//
// A chunk at the head of the log grows as records are appended: a reader
// that asks past its end extends it by reading only the new records (the
// records already decoded are kept), so following the head decodes each
// record once however small the appends are.
//
// Sink runners read through it with sinkSource (sinksource.go).
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
	recs []sinks.Record // dense: recs[i].Offset == start+i
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
// records with Offset >= from, in order, without blocking; skipped counts
// records removed by retention in [from, first returned). The records are
// shared: read-only.
func (c *chunkCache) Read(ctx context.Context, from uint64) ([]sinks.Record, uint64, error) {
	return c.readMax(ctx, from, int(c.chunk))
}

// readMax is Read returning at most max records (never more than the rest
// of from's chunk).
func (c *chunkCache) readMax(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	if from == 0 {
		from = 1
	}
	if max <= 0 {
		return nil, 0, nil
	}
	direct := func() ([]sinks.Record, uint64, error) {
		return c.log.Read(ctx, from, int(min(uint64(max), c.chunk)))
	}
	first, last := c.log.Bounds()
	if from > last || from < first {
		// Nothing new yet (the caller will Wait), or behind retention (the
		// log reports the loss): no caching.
		return direct()
	}
	start := (from-1)/c.chunk*c.chunk + 1

	c.mu.Lock()
	e := c.entries[start]
	var prev *chunkEntry // a complete entry that the new one extends
	if e != nil {
		select {
		case <-e.done:
			switch {
			case !e.ok:
				e = nil // failed: read again
			case e.last() < from:
				prev, e = e, nil // the chunk has grown past it
			}
		default: // being read by another reader: share it
		}
	}
	leader := e == nil
	if leader {
		e = &chunkEntry{done: make(chan struct{})}
		c.put(start, e)
	}
	c.mu.Unlock()

	if leader {
		c.fill(ctx, e, start, prev)
	} else {
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	if !e.ok || e.last() < from {
		return direct()
	}
	i := int(from - start)
	j := min(len(e.recs), i+max)
	return e.recs[i:j:j], 0, nil // capped: an append by the caller copies
}

// fill reads the chunk at start into e: the whole chunk, or only what
// follows prev's records when prev (an earlier, shorter read of the same
// chunk) is given.
func (c *chunkCache) fill(ctx context.Context, e *chunkEntry, start uint64, prev *chunkEntry) {
	defer close(e.done)
	from, have := start, []sinks.Record(nil)
	if prev != nil {
		have = prev.recs
		from = prev.last() + 1
	}
	recs, skipped, err := c.log.Read(ctx, from, int(start+c.chunk-from))
	if err != nil || skipped != 0 || len(recs) == 0 || recs[0].Offset != from {
		return
	}
	for k, r := range recs {
		if r.Offset != from+uint64(k) {
			return // not dense: do not cache
		}
	}
	e.recs = append(have[:len(have):len(have)], recs...)
	e.ok = true
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

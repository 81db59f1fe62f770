package sinktest

import (
	"context"
	"fmt"
	"sync"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks"
)

// Log is what the contract test needs from a log: the Source the runners
// read, a way to append, and named cursors that survive a runner restart.
// MemLog implements it; the collector's store is adapted to it so the
// contract also runs over the real log.
type Log interface {
	sinks.Source
	// Append stores occurrences at the next offsets.
	Append(ctx context.Context, occs []*eventpipev1.Occurrence) error
	// Cursor returns the persisted cursor called name (the same position
	// every time it is asked for the same name).
	Cursor(name string) (sinks.Cursor, error)
}

// MemLog is an in-memory Log for tests: offsets start at 1, Trim emulates
// retention. It is safe for concurrent use.
type MemLog struct {
	mu      sync.Mutex
	first   uint64 // offset of recs[0]
	recs    []sinks.Record
	notify  chan struct{} // closed and replaced on every append
	cursors map[string]*MemCursor
}

// NewMemLog returns an empty log.
func NewMemLog() *MemLog {
	return &MemLog{first: 1, notify: make(chan struct{}), cursors: map[string]*MemCursor{}}
}

// Append implements Log.
func (l *MemLog) Append(_ context.Context, occs []*eventpipev1.Occurrence) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range occs {
		l.recs = append(l.recs, sinks.Record{Offset: l.first + uint64(len(l.recs)), Occurrence: o})
	}
	close(l.notify)
	l.notify = make(chan struct{})
	return nil
}

// LastOffset implements sinks.SourceHead.
func (l *MemLog) LastOffset() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first + uint64(len(l.recs)) - 1
}

// Trim removes every record with an offset <= upTo (retention).
func (l *MemLog) Trim(upTo uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if upTo < l.first {
		return
	}
	n := upTo - l.first + 1
	if n > uint64(len(l.recs)) {
		n = uint64(len(l.recs))
	}
	l.recs = append([]sinks.Record(nil), l.recs[n:]...)
	l.first += n
}

// Read implements sinks.Source.
func (l *MemLog) Read(_ context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	if from == 0 {
		return nil, 0, fmt.Errorf("read from offset 0: offsets start at 1")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var skipped uint64
	if from < l.first {
		skipped = l.first - from
		from = l.first
	}
	i := from - l.first
	if i >= uint64(len(l.recs)) || max <= 0 {
		return nil, skipped, nil
	}
	end := i + uint64(max)
	if end > uint64(len(l.recs)) {
		end = uint64(len(l.recs))
	}
	return append([]sinks.Record(nil), l.recs[i:end]...), skipped, nil
}

// Wait implements sinks.Source.
func (l *MemLog) Wait(ctx context.Context, after uint64) error {
	for {
		l.mu.Lock()
		last := l.first + uint64(len(l.recs)) - 1
		ch := l.notify
		l.mu.Unlock()
		if last > after {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Cursor implements Log.
func (l *MemLog) Cursor(name string) (sinks.Cursor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.cursors[name]
	if !ok {
		c = &MemCursor{}
		l.cursors[name] = c
	}
	return c, nil
}

// MemCursor is an in-memory sinks.Cursor. FailCommits makes Commit fail
// while it is set, to test commit retries.
type MemCursor struct {
	mu      sync.Mutex
	off     uint64
	commits int
	fail    error
}

// Load implements sinks.Cursor.
func (c *MemCursor) Load() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.off, nil
}

// Commit implements sinks.Cursor. A cursor never moves backwards.
func (c *MemCursor) Commit(off uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return c.fail
	}
	if off < c.off {
		return fmt.Errorf("commit %d: cursor would move back from %d", off, c.off)
	}
	c.off = off
	c.commits++
	return nil
}

// Commits counts successful commits.
func (c *MemCursor) Commits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commits
}

// FailCommits makes every Commit return err until called with nil.
func (c *MemCursor) FailCommits(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fail = err
}

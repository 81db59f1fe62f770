package store

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/collector/wal"
	"github.com/eventpipe/eventpipe/sinks"
)

// ErrNotWritable is wrapped by Append errors after a failed write or fsync:
// retryable (codes.Unavailable); the store repairs itself by reopening the log.
var ErrNotWritable = wal.ErrNotWritable

// ErrClosed is returned after Close.
var ErrClosed = errors.New("store closed")

var errTODO = errors.New("store: not implemented yet")

// Store is the collector's durable state. Safe for concurrent use.
type Store struct{}

var _ sinks.Source = (*Store)(nil)

// AppendResult tells what one Append did.
type AppendResult struct {
	// Stored: occurrences newly written; Duplicates: recognised as stored
	// within the dedupe window (or repeated inside the batch).
	Stored, Duplicates int
	// LastOffset is the offset of the last record stored by this call (0 if
	// none).
	LastOffset uint64
}

// Open opens or creates the store in cfg.Dir, repairing a torn log tail and
// rebuilding the dedupe index from the log.
func Open(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Store, error) {
	return nil, errTODO
}

// Run applies retention periodically and expires the dedupe index; returns
// when ctx ends.
func (s *Store) Run(ctx context.Context) error { <-ctx.Done(); return nil }

// Append stores the occurrences whose event_id was not stored within the
// dedupe window and records (cluster, stream) -> resourceVersion, in one
// durable step, then returns. Concurrent callers share fsyncs. When
// in-flight bytes exceed MaxInflightBytes, Append blocks (ctx-aware). Empty
// occs with a resourceVersion only advances the cluster cursor (bookmarks).
// An empty resourceVersion leaves the cursor unchanged. occs are not
// retained after Append returns.
func (s *Store) Append(ctx context.Context, cluster, stream, resourceVersion string, occs []*eventpipev1.Occurrence) (AppendResult, error) {
	return AppendResult{}, errTODO
}

// ClusterCursor returns the last durably recorded resourceVersion of
// (cluster, stream).
func (s *Store) ClusterCursor(cluster, stream string) (resourceVersion string, ok bool) {
	return "", false
}

// Read returns up to max records with Offset >= from without blocking;
// skipped counts records in [from, first returned) removed by retention.
func (s *Store) Read(ctx context.Context, from uint64, max int) ([]sinks.Record, uint64, error) {
	return nil, 0, errTODO
}

// Wait blocks until a record with Offset > after exists, or ctx ends.
func (s *Store) Wait(ctx context.Context, after uint64) error { return errTODO }

// Cursor returns the persisted cursor of one named consumer (a sink),
// stored atomically under <dir>/cursors/<name>. Names are [a-zA-Z0-9._-]+.
func (s *Store) Cursor(consumer string) (sinks.Cursor, error) { return nil, errTODO }

// Bounds returns the first retained and last stored offsets (last < first
// when the log is empty).
func (s *Store) Bounds() (first, last uint64) { return 1, 0 }

// Lost reports, per consumer, records removed by retention before that
// consumer read them.
func (s *Store) Lost() map[string]uint64 { return nil }

// Writable returns nil when the log accepts appends.
func (s *Store) Writable() error { return errTODO }

// Close flushes and releases the store; pending Appends fail.
func (s *Store) Close() error { return nil }

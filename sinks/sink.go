package sinks

import (
	"context"
	"errors"
	"fmt"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Record is one stored occurrence and its position in the collector's log.
// Offsets start at 1 and increase by one per record.
type Record struct {
	Offset     uint64
	Occurrence *eventpipev1.Occurrence
}

// Pusher is the one function a destination implements. Push delivers the
// whole batch or returns an error; the shared layer (batching, retry,
// backoff, metrics, cursor) is built around it, as OTel's exporterhelper is.
//
// Contract:
//   - nil: every record of the batch is delivered (durably acknowledged by
//     the destination); the caller may advance the cursor past the batch.
//   - *PartialError: the records at its indices were refused permanently and
//     are counted as dropped; all other records are delivered.
//   - an error wrapping *PermanentError: no record can ever be delivered;
//     the whole batch is counted as dropped, record by record.
//   - an error wrapping *ThrottleError: retry after its RetryAfter hint.
//   - any other error: retryable; the same batch is pushed again.
//
// Push must not keep references to the batch after it returns. It may be
// called again with the same records after a failure or a restart: sinks are
// at-least-once and carry event_id so consumers can de-duplicate.
//
// The batch is read-only: Push must not modify the slice, a Record or
// anything reachable from its Occurrence. The records are shared with the
// other runners reading the same log and with follow subscribers (the
// collector decodes each record once for all of them), possibly
// concurrently. A sink that needs a changed occurrence (sanitised strings, a
// truncated message) works on a copy (proto.Clone).
type Pusher interface {
	Push(ctx context.Context, batch []Record) error
}

// Source is what a sink reads: the collector's durable log. Read returns up
// to max records with Offset >= from, in offset order, without blocking
// (possibly fewer than are available: the caller reads again). skipped
// counts records in [from, first returned) that retention removed before
// they were read: they are lost for this consumer and must be counted and
// logged by the caller. Wait blocks until a record with Offset > after
// exists, or ctx ends.
//
// The returned records may be shared with other readers (the collector's
// Source hands every runner the same decoded records): the caller and the
// Pusher treat the slice and the occurrences as read-only.
type Source interface {
	Read(ctx context.Context, from uint64, max int) (records []Record, skipped uint64, err error)
	Wait(ctx context.Context, after uint64) error
}

// Cursor persists one consumer's position: the offset of the last record it
// has handled (delivered or counted as dropped). 0 means nothing yet. Commit
// must be atomic and durable when it returns.
type Cursor interface {
	Load() (uint64, error)
	Commit(offset uint64) error
}

// ProgressCursor is optionally implemented by a Cursor that wants to know,
// between commits, how far its consumer has handled the log (in memory, not
// durable).
type ProgressCursor interface {
	Handled(offset uint64)
}

// LossCursor is optionally implemented by a Cursor whose owner counts, per
// consumer, the records lost to retention (collector/store does:
// eventpipe_collector_log_consumer_lost_records_total). The Runner is the
// only one that knows which records it read before retention removed them,
// so it reports each loss once, when it counts it itself
// (eventpipe_sink_lost_records_total): the two counts agree by construction.
type LossCursor interface {
	Lost(from, n uint64)
}

// PermanentError marks a failure that retrying cannot fix (bad request,
// entry too old, message too large, authentication refused for good).
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError (nil stays nil).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// ThrottleError marks a push the destination asked to slow down (HTTP 429,
// gRPC RESOURCE_EXHAUSTED, Kafka throttling). RetryAfter is the destination's
// hint, zero when it gave none.
type ThrottleError struct {
	Err        error
	RetryAfter time.Duration
}

func (e *ThrottleError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("throttled (retry after %s): %v", e.RetryAfter, e.Err)
	}
	return "throttled: " + e.Err.Error()
}
func (e *ThrottleError) Unwrap() error { return e.Err }

// Throttle wraps err as a ThrottleError (nil stays nil).
func Throttle(err error, retryAfter time.Duration) error {
	if err == nil {
		return nil
	}
	return &ThrottleError{Err: err, RetryAfter: retryAfter}
}

// PartialError reports that some records of a batch were refused for good
// while all the others were delivered. Failed maps the index in the batch to
// the reason.
type PartialError struct {
	Failed map[int]error
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("%d record(s) refused permanently", len(e.Failed))
}

// IsPermanent reports whether err wraps a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

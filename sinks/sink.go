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

// Transactor is implemented by a Pusher whose destination can store the
// consumer's position together with a batch, atomically: a Kafka sink
// reading a Kafka source (consume-transform-produce). The collector's
// Kafka mode asks it for one TxnPusher per source partition it owns;
// elsewhere the Pusher is used as usual.
type Transactor interface {
	Transactional(src TxnSource) (TxnPusher, error)
}

// TxnSource is one partition of a Kafka source read by a consumer group.
type TxnSource struct {
	// Group, Topic and Partition name what is consumed; the offset after
	// each pushed batch is committed to Group inside the batch's
	// transaction.
	Group, Topic string
	Partition    int32
	// TransactionalID is the producer's transactional.id. It belongs to
	// the partition, not to the process: the partition's next owner uses
	// the same id, which fences a previous owner still alive (a zombie)
	// and aborts what it left open.
	TransactionalID string
	// Timeout is the transaction timeout (an open transaction of a killed
	// owner is aborted after it, or at once when the next owner starts).
	Timeout time.Duration
	// Member returns the group member id and generation the commits are
	// made under: a member the group has removed is refused.
	Member func() (memberID string, generation int32)
	// Committed is told the offset (the Kafka offset after the batch,
	// which equals the last record's sinks Offset) each committed
	// transaction stored.
	Committed func(offset uint64)
}

// TxnPusher pushes one partition's batches, each with its position in one
// transaction: Push returning nil means the batch and the group offset
// after its last record (Record.Offset, Kafka offset + 1) are both stored;
// an error means neither is visible to read_committed readers. Init
// fences the partition's previous owner; call it before reading the
// group's committed offset. Close releases the producer.
type TxnPusher interface {
	Pusher
	Init(ctx context.Context) error
	Close()
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

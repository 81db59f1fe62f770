// Package sinks holds what every destination shares: the Pusher contract a
// destination implements, the error classes it returns, and the Source and
// Cursor it reads through. Each destination lives in its own subpackage
// (sinks/file, sinks/loki, sinks/kafka).
//
// sinks depends only on the schema (api/eventpipe/v1). The collector's log
// implements Source and Cursor; the collector wires sinks to it. Nothing here
// imports the collector.
//
// # Runner: the shared layer
//
// A Runner (like OTel's exporterhelper) moves one sink's records from the
// log to its Pusher:
//
//   - it reads from Cursor+1, applies the sink's filter (hot-swappable with
//     SetFilter), and batches by size (batch.max_records) and time
//     (batch.max_wait after the batch's first record);
//   - retryable errors are retried for ever with exponential backoff and
//     jitter (retry.*): nothing is dropped, the lag grows and is visible in
//     Status and metrics; a ThrottleError's RetryAfter replaces the backoff;
//   - a PermanentError drops the batch, a PartialError only its indices:
//     each dropped record is logged (offset, event_id, reason) and counted
//     in eventpipe_sink_failed_records_total{reason="permanent|partial"};
//   - filtered-out records and records removed by retention before they were
//     read advance the cursor; they are counted (filtered, lost) and lost
//     ranges are logged;
//   - the cursor is committed after each push that ended (not per record),
//     and when the runner catches up with only filtered or lost records;
//   - on cancellation the in-flight push is abandoned (its context is
//     cancelled; one push never outlives retry.push_timeout) and nothing
//     undelivered is committed: the next runner redelivers from the cursor.
//     Sinks are therefore at-least-once; consumers de-duplicate by event_id.
//
// Every runner registers the same metric vectors (label sink = the
// configured name) on the Registerer it is given; later runners reuse the
// vectors already registered there.
package sinks

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
//   - the cursor is committed (a durable write) only for records handled
//     (delivered, dropped, filtered or lost), never per record: while
//     records flow at most once per commit_interval (default 1s; 0 = after
//     every push that ended); when the runner has caught up with the log,
//     at once if the last commit is older than commit_interval, else as
//     soon as it is, if no new record came meanwhile (a runner following a
//     live log catches up after every append, which must not cost an fsync
//     each); and when the runner stops cleanly. Status.Handled is the
//     position reached, Status.Cursor the position committed;
//   - on cancellation the in-flight push is abandoned (its context is
//     cancelled; one push never outlives retry.push_timeout) and nothing
//     undelivered is committed: the next runner redelivers from the cursor.
//     Sinks are therefore at-least-once; consumers de-duplicate by event_id.
//     After a crash (no clean stop) the replay also covers what was
//     handled since the last commit: at most commit_interval's worth of
//     records, more only while cursor commits fail;
//   - records are read-only: the Source may hand the same decoded records
//     to several runners (the collector does), so neither the runner, its
//     filter nor the Pusher modifies them (see Pusher).
//
// Every runner registers the same metric vectors (label sink = the
// configured name) on the Registerer it is given; later runners reuse the
// vectors already registered there.
package sinks

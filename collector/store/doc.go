// Package store is what the collector stores: occurrences in the durable log
// (collector/wal), de-duplicated by event_id, each agent's watch cursor
// (cluster, stream) -> resourceVersion, and one persisted cursor per named
// consumer (sink).
//
// Contract:
//   - Append returns only after the new occurrences AND the cluster cursor
//     are durable (one group commit: the log's fsync and the checkpoint
//     slot's fsync, both finished before any caller of the group is
//     answered). A returned
//     error means nothing of the batch may be assumed stored; retrying the
//     same batch is safe (duplicates are recognised by event_id).
//   - An occurrence whose event_id was stored within DedupeWindow is not
//     stored again, across restarts too (the index is rebuilt from the log on
//     Open).
//   - The cluster cursor is never ahead of the data: a checkpoint records the
//     log offset it covers and Open ignores one that is ahead of the log, so
//     after a crash it is at worst behind (the agent replays, dedupe absorbs
//     the replay).
//   - Offsets seen by consumers are dense (1, 2, 3, ...) and name occurrences
//     only; checkpoints live in their own file (see FORMAT.md).
//   - Read and Wait implement sinks.Source; Cursor returns a sinks.Cursor
//     persisted atomically under <dir>/cursors/<name>.
//   - Retention removes whole segments by size and age; a consumer that had
//     not read the removed records loses them loudly: its sink runner counts
//     and logs them (eventpipe_sink_lost_records_total) and reports them to
//     its cursor, which counts the same number per consumer (Lost,
//     eventpipe_collector_log_consumer_lost_records_total). Records a runner
//     read before they were removed (a batch it is still pushing) are not
//     lost for it.
//   - Open verifies the log (collector/wal, FORMAT.md there). Acknowledged
//     records found damaged or missing (a flipped byte, a disk that lost
//     fsynced data, a consumer cursor beyond the log's end) make Open fail
//     with ErrDataLoss and leave the data directory untouched, unless
//     Config.AcceptDataLoss (store.accept_data_loss) is set for that start:
//     then every intact record is kept, the loss is logged at ERROR and
//     counted in eventpipe_collector_log_data_loss_records_total, and the
//     offsets concerned are never handed out again. The committed consumer
//     cursors are the evidence of what was acknowledged (Options.AckedThrough).
//   - After a failed write or fsync, Append fails with an error wrapping
//     ErrNotWritable (retryable) until the store repairs itself by reopening
//     the log (attempted on the next Append and by Run). The reopen fsyncs
//     whatever the failed write left readable before it counts as stored.
//     Known limit (the "fsyncgate" problem): on Linux a failed fsync may mark
//     dirty pages clean, so data readable after it may not be on disk; only a
//     restart of the machine would show that. PostgreSQL answers this by
//     crashing; we refuse, repair and re-verify instead.
//   - Readable reports an offset consumers cannot read past (a read that
//     failed there and that no later read got past), so that /readyz shows
//     a log whose consumers cannot progress.
//   - Errors wrapping ErrInvalid are about the batch itself (not retryable);
//     ErrClosed after Close.
//
// Checkpoints live in two alternating slot files beside the log rather than
// in the log, so consumer offsets stay dense; FORMAT.md gives the layout.
package store

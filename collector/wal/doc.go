// Package wal is the framing layer of the collector's durable log: an
// append-only sequence of opaque records split into segment files, one
// CRC-32C per record, offsets starting at 1 and increasing by one per record.
//
// Contract:
//   - Append returns only after the records are written and fsynced; callers
//     that append concurrently share one write and one fsync (group commit).
//     First/last offsets are dense: a batch of n records gets n consecutive
//     offsets.
//   - Every bit of a segment header is checked against what it must hold
//     (constants, the file name, the first frame's version). A damaged
//     header costs no record, since the frames carry their own offsets and
//     checksums; it counts as damaged fsynced bytes (refused unless
//     accepted, then ERROR, counted and rewritten), never as a torn tail.
//   - Every frame carries its offset and checksum. Open verifies the last
//     segment, resynchronises after a damaged frame so that one bad record
//     costs that record only, and tells a torn write (the last, never
//     acknowledged round: repaired, WARN, eventpipe_collector_log_repaired_*)
//     from acknowledged data lost (fsynced data damaged or missing: refused
//     with ErrDataLoss and left untouched unless Options.AcceptDataLoss,
//     then ERROR and eventpipe_collector_log_data_loss_*). A torn tail cannot
//     hold an acknowledged record (FORMAT.md proves it).
//   - Offsets are never handed out twice: offsets a repair dropped, or that
//     a consumer committed beyond the log's end (Options.AckedThrough), are
//     skipped (Bounds counts them, readers step over them, LastRecord is the
//     newest record). The skipped offsets are a gap segment of their own
//     (a header marked as a gap, no frame), written where the repair makes
//     them.
//   - Every other sealed segment ends right before the next one starts
//     (the next segment's format version 4 header promises it). One whose
//     intact frames end earlier lost its tail (cut at a frame boundary):
//     acknowledged data lost, the exact records, never a silent step.
//     Before a version 2 segment the old rule holds (FORMAT.md, limits).
//   - After a failed write or fsync the WAL refuses every further append with
//     an error wrapping ErrNotWritable (retryable) until it is closed and
//     opened again, which repairs whatever the failure left behind. It never
//     acknowledges data that is not durable.
//   - Write and Sync split Append for a caller that runs its own group
//     commit and adds a durable step of its own (collector/store writes its
//     checkpoint in the same round). Records become visible to Read only
//     when a Sync covering them returned nil.
//   - Read returns records by offset and may run concurrently with Append.
//   - Retention removes whole segments (never the active one), oldest first.
//     A gap segment it removes held no record: Retain marks it (SegmentInfo.Gap)
//     and ReadSkip leaves its offsets out of the records a reader missed.
//   - Every file access goes through FS so tests can inject short writes,
//     failed writes and failed fsyncs.
//
// Why not a library: docs/contributing.md prefers a proven library for framing. The two
// candidates were read. Prometheus tsdb/wlog is the model here (segments,
// CRC-32C per record, repair by truncation), but it lives inside
// github.com/prometheus/prometheus, a dependency far too heavy for one
// package, it fragments records into 32 KiB pages (not needed for our record
// sizes) and it has no group commit or pluggable file system for fault
// injection. github.com/tidwall/wal has no per-record checksum, no group
// commit across concurrent callers and no fault-injection seam. So this
// package is written here, small, with its format specified in FORMAT.md.
package wal

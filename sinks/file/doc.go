// Package file is eventpipe's default sink: occurrences as JSON lines in a
// local file, rotated by size.
//
// Each line is one occurrence in protojson form with the proto field names
// (event_id, occurred_at, sandbox.id, ...), compact, terminated by '\n'. It
// is produced by sinks/internal/jsonenc, which says what protojson says at a
// sixth of its cost (tests check the equivalence).
// Push appends the whole batch and fsyncs before it returns nil, so a
// record the runner commits is on disk. A failed write is rolled back
// (the file is truncated to its last synced size), so a reader never sees a
// torn line and a retried batch is not half-duplicated.
//
// A restart does not append what the file already holds. The runner
// commits its cursor after the fsync, at most once per commit_interval, so
// after a stop (clean or SIGKILL) it pushes again what it wrote since its
// last commit. New reads back the event_ids of the last resend_window
// complete lines of the kept files (the active one, then the rotated ones)
// and Push skips a record whose event_id is among the ids written last
// (eventpipe_sink_file_repeated_records_total); the collector stores each
// event_id once, so such a record is always a repeat. A torn last line
// (killed mid-write, before the fsync that would have let the runner
// commit it) is cut at open and counted (eventpipe_sink_file_torn_lines_total);
// its record is pushed again and written whole. The file is the position:
// nothing besides it is written, so there is no second state to fall out
// of step with it. The bound is the window: a resend reaching further back
// than resend_window lines (a cursor far behind, a window set below
// commit_interval's worth of records) is written again. Records without an
// event_id are never skipped. Reading back a full default window (65,536
// lines) takes 0.16 s at start on the shared 2-core test machine at load
// 18 (BenchmarkOpenReadBack): the id is read from each line's start, not
// decoded.
//
// Rotation: when a batch would take the file over max_bytes, the file is
// renamed PATH.1 (PATH.1 to PATH.2, and so on) and a new PATH is started;
// at most max_files rotated files are kept, the oldest is removed. A single
// batch larger than max_bytes is written whole into a fresh file.
//
// Strings that are not valid UTF-8 are written with U+FFFD in place of each
// bad byte; a record that cannot be encoded (a timestamp outside years
// 1-9999, no occurrence) is refused permanently through sinks.PartialError
// (counted and logged by the runner).
package file

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
// torn line and a retried batch is not half-duplicated; a record the
// runner pushes again after a crash or a lost acknowledgement is written
// again (at-least-once: de-duplicate by event_id).
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

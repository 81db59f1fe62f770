// Package kafka is the audit-archive sink: every occurrence becomes one
// Kafka record produced with segmentio/kafka-go, acks=all.
//
// Contract (details and the value schema in README.md):
//   - key = sandbox id, else "<namespace>/<involved object uid>", so one
//     sandbox's occurrences stay ordered in one partition (murmur2, like the
//     Java client);
//   - value = versioned JSON of the occurrence in one stable field order
//     (value_format: json), or the eventpipe.v1.Occurrence protobuf
//     encoding (value_format: protobuf), or an OCSF 1.8.0 Application
//     Lifecycle event for audit archives (value_format: ocsf, docs/ocsf.md);
//   - CloudEvents binary-mode headers: ce_specversion, ce_id (= event_id),
//     ce_source, ce_type, ce_time, ce_subject (= sandbox id), content-type,
//     and eventpipe-version (the build that wrote the record);
//   - a record over max_message_bytes has its message truncated (on a UTF-8
//     boundary) and message_truncated set; what still does not fit is
//     refused permanently through sinks.PartialError (counted and logged by
//     the runner), never silently;
//   - errors map to the runner's classes: per-message errors of
//     kafka.WriteErrors become a PartialError (refused for good) or a
//     retryable error for the batch (transient); broker unavailability,
//     timeouts and leader changes are retryable; throttling is a
//     ThrottleError; authentication and authorisation failures are
//     retryable (they can be fixed by an operator without losing data) but
//     are logged as errors.
//
// Push is synchronous: it returns nil only when every record of the batch
// was acknowledged by all in-sync replicas. Push only reads the batch (see
// sinks.Pusher): truncation and UTF-8 repair work on copies.
//
// compression: snappy uses snappy's standard (fast) encoder, as the Java
// client and librdkafka do, not kafka-go's default "better" level, which
// costs about twice the CPU for a few percent of size. kafka-go keeps the
// codec in a process-wide table: New sets that table's snappy level once,
// for every kafka-go writer in the process (eventpipe has no other).
package kafka

// Package backbone is the collector's Kafka mode (`log: kafka`): the
// backbone topic takes the place of the local durable log, so collectors
// become a stateless tier that any number of replicas can form.
//
// It starts with the record format every part agrees on (record.go):
// producers (ingest), consumers (the sinks' consumer groups, the Follow
// servers) and consumers outside eventpipe read the same records.
//
// The read side:
//   - Window (dedupe.go): the last N event ids of one partition, to drop
//     the copy an agent resends after a failover; bounded, evictions
//     counted.
//   - Reader (reader.go): decoded records of some partitions from a start
//     offset each, duplicates dropped by a Window per partition seeded
//     from the records before the start, undecodable records counted and
//     skipped, offsets removed by retention reported (Record.Skipped).
//     Every eventpipe consumer of the backbone reads through it.
//   - GroupSinks (groupsinks.go): every sink as a consumer group member,
//     one sinks.Runner per assigned partition, the group offset committed
//     only after the sink acknowledged.
//
// The Follow server over the topic is in package collector
// (follow_kafka.go), next to the local one it shares its checks with.
// docs/kafka-backbone.md describes the mode for operators and
// docs/kafka-consumers.md the read side and the dedupe window.
package backbone

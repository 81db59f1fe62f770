// Package backbone is the collector's Kafka mode (`log: kafka`): the
// backbone topic takes the place of the local durable log, so collectors
// become a stateless tier that any number of replicas can form.
//
// record.go is the record format every part agrees on: producers
// (ingest), consumers (the sinks' consumer groups, the Follow servers)
// and consumers outside eventpipe read the same records. config.go is the
// `backbone:` section of the collector's YAML. writer.go is the ingest
// side: a batch is acknowledged only after Kafka acknowledged all its
// records (acks=all), and its cursor is written to a compacted topic only
// after that, so any replica can tell an agent where to resume. The writer
// does not remove duplicates; consumers do, by event_id.
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

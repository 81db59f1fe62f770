// Package backbone is the collector's Kafka mode (`log: kafka`): the
// backbone topic takes the place of the local durable log, so collectors
// become a stateless tier that any number of replicas can form.
//
// record.go is the record format every part agrees on: producers
// (ingest), consumers (the Loki writer's consumer group, the Follow
// servers) and consumers outside eventpipe read the same records.
// config.go is the `backbone:` section of the collector's YAML. writer.go
// is the ingest side: a batch is acknowledged only after Kafka
// acknowledged all its records (acks=all), and its cursor is written to a
// compacted topic only after that, so any replica can tell an agent where
// to resume. The writer does not remove duplicates; consumers do, by
// event_id. docs/kafka-backbone.md describes the mode for operators.
package backbone

// Package backbone is the collector's Kafka mode (`log: kafka`): the
// backbone topic takes the place of the local durable log, so collectors
// become a stateless tier that any number of replicas can form.
//
// This file set starts with the record format every part agrees on:
// producers (ingest), consumers (the Loki writer's consumer group, the
// Follow servers) and consumers outside eventpipe read the same records.
// docs/kafka-backbone.md describes the mode for operators.
package backbone

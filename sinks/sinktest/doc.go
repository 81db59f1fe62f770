// Package sinktest is the contract every sink passes, and the test material
// sinks share.
//
// RunContract runs a sink through success, a real transient outage,
// permanent refusal of some records, random failures (including lost
// acknowledgements that cause duplicates), a restart in the middle and log
// retention, each time through a real sinks.Runner, and asserts
// at-least-once delivery of every record not refused and that every drop is
// counted in Status and in the metrics. A sink's test provides a Harness: a
// Target builds its Pusher against a real destination, reads back what was
// delivered (by event_id) and induces a real outage. The log defaults to
// MemLog; Harness.NewLog runs the contract over another log:
// collector/store's TestSinkContractOverTheStore runs it over the real
// store and the real file sink, with the store's own retention (Retainer)
// and a check that the store's per-consumer loss count agrees with the
// runner's (LossCounter).
//
// Generator makes realistic occurrences (the seed sandbox
// 2ff21e26-1a7b-49a2-a640-14ae153f93ea in openshell-openshell-repro, kubelet
// and scheduler messages, supervisor pulls, unattributed events); Hostile
// makes the bad input every sink must deliver or count, never crash on.
package sinktest

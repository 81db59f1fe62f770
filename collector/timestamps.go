package collector

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// badTimestamp returns the path and the problem of the first
// google.protobuf.Timestamp set in o that is outside the range protobuf
// defines for it (years 1 to 9999, nanos 0 to 999,999,999), or "" when
// every one is valid.
//
// Why at ingest: the JSON encoders (file, Kafka JSON, Loki) cannot write
// such a time, so a sink would drop the record for good after the agent
// was told it is stored. The fields are listed rather than found by
// reflection (this runs for every occurrence, without allocating);
// TestBadTimestampCoversEveryTimestampField fails when the schema gains a
// Timestamp this list misses.
func badTimestamp(o *eventpipev1.Occurrence) (path, problem string) {
	pf, bl := o.GetPullFailure(), o.GetBlocker()
	for _, f := range [...]struct {
		path string
		ts   *timestamppb.Timestamp
	}{
		{"occurred_at", o.GetOccurredAt()},
		{"observed_at", o.GetObservedAt()},
		{"pull_failure.first_seen", pf.GetFirstSeen()},
		{"pull_failure.last_seen", pf.GetLastSeen()},
		{"blocker.first_seen", bl.GetFirstSeen()},
		{"blocker.last_seen", bl.GetLastSeen()},
	} {
		if f.ts == nil {
			continue
		}
		if err := f.ts.CheckValid(); err != nil {
			return f.path, fmt.Sprintf("seconds %d, nanos %d: %v", f.ts.GetSeconds(), f.ts.GetNanos(), err)
		}
	}
	return "", ""
}

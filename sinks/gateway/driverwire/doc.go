// Package driverwire is the one place where eventpipe reads and writes the
// wire layout of OpenShell's compute driver protocol
// (openshell.compute.v1.ComputeDriver). Everything else in the gateway proxy
// forwards bytes it does not look into.
//
// Layout: pinned to the layout of OpenShell main as of 2026-08-21 (Layout),
// written from the field tables in docs/openshell.md with
// google.golang.org/protobuf/encoding/protowire; no generated code. Only the
// fields eventpipe touches are named here:
//
//	DriverSandbox            1 id, 5 status
//	DriverSandboxStatus      5 repeated conditions
//	DriverCondition          1 type, 2 status, 3 reason, 4 message, 5 last_transition_time
//	DriverPlatformEvent      1 timestamp_ms, 2 source, 3 type, 4 reason, 5 message, 6 map metadata
//	WatchSandboxesEvent      oneof 1 sandbox{1 DriverSandbox}, 2 deleted{1 sandbox_id}, 3 platform_event{1 sandbox_id, 2 event}
//	GetSandboxResponse       1 DriverSandbox
//	ListSandboxesResponse    1 repeated DriverSandbox
//
// Contract:
//   - Messages are edited in place: every field this package does not change
//     (unknown fields included) keeps its bytes and its position; added
//     fields go after the existing ones. A message the proxy has nothing to
//     add to comes back as the same slice, unchanged.
//   - Malformed input is an error, never a panic; the caller then forwards
//     the original bytes untouched (fail-open).
//   - Proto merge semantics are honoured: for a scalar field the last
//     occurrence wins, a sub-message may be split over several occurrences.
//
// A newer layout (the driver timestamps becoming google.protobuf.Timestamp,
// DriverSandboxStatus.sandbox_name renamed) is added here, as a second
// Layout value selected by configuration, not by editing this one: none of
// the fields above change number in the changes announced upstream, so the
// edits stay valid, and the new timestamp fields pass through untouched as
// fields this package does not name.
package driverwire

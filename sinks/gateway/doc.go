// Package gateway is the OpenShell gateway destination of eventpipe: a
// transparent proxy between the OpenShell gateway and its out-of-process
// compute driver (openshell.compute.v1.ComputeDriver over a Unix socket)
// that adds what eventpipe knows about a sandbox to what the gateway
// already reads from the driver. Run by `eventpipe driver-proxy`; see
// README.md for the wiring and docs/openshell.md for the protocol.
//
// Contract:
//   - Transparent: every RPC, known to this build or not, unary or
//     streaming, passes through byte for byte with its request metadata
//     (trace context included), deadline, response headers, trailers and
//     status (details included). The gRPC legs (relay: grpc, the
//     default) forward messages with a raw codec; the frame relay
//     (relay: frame, opt-in; relay.go) forwards HTTP/2 frames and never
//     decodes a message. Either way exactly three places are edited, all through
//     package driverwire: WatchSandboxes messages, GetSandbox and
//     ListSandboxes responses (in frame mode the relay answers
//     WatchSandboxes itself through its gRPC client leg, and edits Get and
//     List answers on the frame path: relayedit.go).
//   - Platform events: every attributed occurrence of this gateway (the
//     collector's Follow stream, gateway_id selector) becomes one
//     WatchSandboxesPlatformEvent (source "kubernetes") spliced into every
//     open WatchSandboxes stream, with the keys the gateway and the CLI
//     read (involved_kind, involved_name, namespace, count, the corrected
//     openshell.progress.* keys) and eventpipe.* keys. The driver's own
//     "kubernetes" platform events are dropped (drop_driver_kubernetes_events)
//     so each occurrence arrives once, while the Follow stream is up or was
//     up less than follow.fail_open_after ago; otherwise they pass.
//   - At most once per gateway connection: an event id is sent once on a
//     connection (a dedupe window of follow.dedupe_window ids). A stream
//     reopened on the same connection gets what it has not had yet; a new
//     connection (a restarted gateway) first gets the recent tail of every
//     live sandbox (follow.tail_per_sandbox, like the gateway's own replay
//     tail), so `sandbox create` progress is not blanked. Across a proxy
//     restart the cursor up to which events were sent is written ahead of
//     sending to follow.state_file: the first connection after the restart
//     (the gateway that kept running) is not sent those again.
//   - Conditions: while a pull failure is active for a sandbox (the latest
//     failure of a container not superseded by a Pulled of that container,
//     or of the workload's agent container for the workload pod), every
//     DriverSandbox the gateway receives carries ImagePulled=False with the
//     cause as reason (CamelCase) and a message naming the image and its
//     role, the disposition, the attempts and the runtime's words; the
//     driver's Ready=False message gets the same diagnosis appended, its
//     reason untouched. The phase is never changed and no condition type or
//     reason the gateway acts on is used.
//   - Fail-open: the collector down, slow or refusing, or a driver message
//     driverwire cannot parse, never blocks or alters driver traffic; the
//     message goes through unchanged (counted, logged) and the Follow
//     stream is retried with backoff from its cursor.
//   - Bounded: at most follow.max_sandboxes sandboxes and follow.max_events
//     events are kept. Streams read a ring of the last max_events events
//     at their own pace; one that falls further behind catches up from the
//     tails (the sent set keeps it exact). Every drop is counted.
//   - Socket: the directory belongs to the proxy's uid and is 0700
//     (created so, forced to 0700 if ours, refused if another uid owns
//     it); the socket is 0600; a peer with another uid (SO_PEERCRED) is
//     dropped, logged and counted.
package gateway

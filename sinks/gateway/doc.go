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
//     status (details included). One relay: a gRPC server leg towards
//     the gateway and a gRPC client leg towards the driver, messages
//     forwarded with a raw codec; the request content-type reaches the
//     driver as sent, and a driver answer of headers then a status stays
//     two blocks (never made trailers-only). Exactly three places are
//     edited, all through package driverwire: WatchSandboxes messages,
//     GetSandbox and ListSandboxes responses.
//   - Platform events: every attributed occurrence of this gateway (the
//     collector's Follow stream, gateway_id selector) becomes one
//     WatchSandboxesPlatformEvent (source "kubernetes") spliced into every
//     open WatchSandboxes stream, with the keys the gateway and the CLI
//     read (involved_kind, involved_name, namespace, count, the corrected
//     openshell.progress.* keys) and eventpipe.* keys. The driver's own
//     "kubernetes" platform events are dropped (drop_driver_kubernetes_events)
//     so each occurrence arrives once, but only while the Follow stream is
//     live: before it first comes up and from the first moment of an
//     outage they pass unchanged.
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
//     stream is retried with backoff from its cursor, at once when a probe
//     finds the collector reachable again.
//   - Bounded: at most follow.max_sandboxes sandboxes and follow.max_events
//     events are kept. Streams read a ring of the last max_events events
//     at their own pace; one that falls further behind catches up from the
//     tails (the sent set keeps it exact). Every drop is counted.
//   - Socket: only the proxy's uid may write to its directory (created
//     0700 when missing; an existing one is never chmodded, and refused
//     when another uid owns it or others may write to it); the socket is
//     0600; a peer with another uid (SO_PEERCRED) is dropped, logged and
//     counted.
package gateway

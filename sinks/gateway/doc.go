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
//   - Conditions: while a blocker is active for a sandbox, every
//     DriverSandbox the gateway receives (WatchSandboxes snapshots,
//     GetSandbox, ListSandboxes) carries one condition per kind, status
//     False: ImagePulled (a pull failure), PodScheduled (unschedulable),
//     VolumesReady (volume), PodCreated (create_refused) and
//     ContainersRunning (container); the cause in CamelCase as reason; a
//     message naming what is blocked (the image and its role, the pod, the
//     claim or the Sandbox), the cause and how sure it is, the
//     disposition, the attempts, the object the cause names (Secret/x,
//     ResourceQuota/y), the container, the exit code and the runtime's or
//     Kubernetes' words (the scheduler's node summary). The driver's
//     Ready=False message gets each condition's message appended, its
//     reason untouched. The phase is never changed and no condition type or
//     reason the gateway acts on is used.
//   - Blockers and their end are diagnosis.Folder's, the fold `eventpipe
//     diagnose` reads (one implementation; its doc lists the events that
//     end each kind: Pulled, Scheduled, the kubelet going on, the agent's
//     Sandbox condition occurrence without a refusal, Started, the
//     agent's container readiness occurrence, a crashed container staying
//     up a minute by the proxy's clock). The patch of a
//     sandbox is computed when an occurrence changes its blockers, and
//     again once a crash blocker in it may have settled, never per answer.
//     Readiness and startup probe failures get their condition
//     (ContainersRunning, ReadinessProbeFailed or StartupProbeFailed),
//     ended by the agent's container readiness occurrence once the
//     container is ready again. Liveness failures get none: one below the
//     failureThreshold restarts nothing, so no Started would end it, and a
//     liveness probe that keeps failing shows as the crash loop the
//     kubelet's restarts make of it.
//   - Several at once: one condition per kind, the first of its kind in
//     the folder's order (a supervisor image first, then by stage:
//     creation, claims, scheduling, volumes, pulls, containers, then
//     oldest first), which also leads the Ready suffix.
//   - Replacement: blockers are kept by sandbox id; a sandbox seen deleted
//     (the agent's deletion occurrence, the driver's WatchSandboxes
//     deletion) or evicted is forgotten with them, so a new sandbox under
//     its name (a new id) starts with nothing.
//   - Fail-open: the collector down, slow or refusing, or a driver message
//     driverwire cannot parse, never blocks or alters driver traffic; the
//     message goes through unchanged (counted, logged) and the Follow
//     stream is retried with backoff from its cursor, at once when a probe
//     finds the collector reachable again.
//   - Bounded: at most follow.max_sandboxes sandboxes (with their
//     blockers, at most 32 each: more are counted, not kept) and
//     follow.max_events events are kept. Streams read a ring of the last
//     max_events events at their own pace; one that falls further behind
//     catches up from the tails (the sent set keeps it exact). Every drop
//     is counted.
//   - Socket: only the proxy's uid may write to its directory (created
//     0700 when missing; an existing one is never chmodded, and refused
//     when another uid owns it or others may write to it); the socket is
//     0600; a peer with another uid (SO_PEERCRED) is dropped, logged and
//     counted.
package gateway

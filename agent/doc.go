// Package agent is eventpipe's cluster agent: the only part that talks to the
// Kubernetes API. It watches Events cluster-wide, attributes each occurrence
// with enrich against small caches (Pods, PVCs, Namespaces, Agent Sandbox
// CRs), and ships batches to the collector's Ingest service.
//
// # How it reads the API
//
// Plain HTTP (kube.go), authenticated by client-go's transport (kubeconfig or
// in-cluster credentials, exec plugins, token rotation, TLS), with the bodies
// decoded by agent/internal/kwire straight into enrich's small types:
// protobuf for Events, Pods, PVCs and Namespaces, JSON for the Sandbox CR.
// No typed clientset, no informers, no client-go leaderelection: those decode
// every object into its full typed struct, hold a whole first listing before
// any transform, and link and register every built-in API group, which cost
// most of the agent's CPU and memory (bench/agent.md has the before/after).
// What they did is here in small form: reflector.go (list or watch-list, then
// watch, relist on 410, deletions found by a relisting) and lease.go (the
// same Lease algorithm and fields as client-go's elector).
//
// # Which Event API
//
// The agent watches core/v1 Events. core/v1 and events.k8s.io/v1 are two
// views of the same objects, so one watch sees everything; core/v1 is chosen
// because kubelet (image pulls, back-offs: the events that matter most here)
// still writes through it, and because its shape carries every field the
// schema needs: count, source.component/host, and also eventTime, series,
// reportingController/Instance and action for events written through
// events.k8s.io. Watching both would double the API load and the work.
//
// # Contract
//
//   - One cluster-wide list+watch of Events, driven by the agent itself (no
//     informer: it would own the resourceVersion and keep every Event in
//     memory). The initial or recovery listing is a WatchList
//     (sendInitialEvents, served from the watch cache) with a paginated LIST as
//     the fallback. No GET per Event, ever.
//   - The cursor sent with a Batch is the resourceVersion up to which every
//     Event has been put in that batch or an earlier one, so the collector's
//     stored cursor (advanced only when it acknowledges the batch, in order)
//     never passes an Event that was not durably stored. A held Event (owner
//     not cached yet) holds the cursor back until it ships.
//   - Occurrences: every ADDED, every MODIFIED that changes count, series.count
//     or the message (a bounded LRU of fingerprints tells; an Event the LRU does
//     not know is shipped, the collector de-duplicates by event_id), every
//     relisted Event (same event_id as before: the collector de-duplicates).
//   - Memory is bounded: a fixed-capacity queue between the watch reader and
//     the processor, a bounded hold, a bounded number of batches in flight.
//     When the collector is slow or down, the watch reader blocks and the API
//     server keeps the data.
//   - Latency: a batch goes out when full, at the ship.flush_interval tick,
//     or, when no batch awaits its acknowledgement, ship.idle_linger after
//     the processor handled what the watch delivered (ship.flush_when_idle):
//     a sandbox's user waits tens of milliseconds, not a tick, and under load
//     batches still fill while others are in flight (bench/agent.md).
//   - Late binding: an Event whose involved object (or its owner) is not
//     cached is held (hold.max_events, hold.max_age) and re-enriched on every
//     cache change; when the hold is full or the time is up it ships
//     unattributed, never dropped. Only fresh Events are held
//     (hold.fresh_within): an old one's owner is gone, not late.
//   - Caches keep compact enrich values decoded from the wire (owner
//     references, the OpenShell labels/annotations, container names,
//     images, probes set, waiting/terminated states, ready, started, phase,
//     node), never the API objects.
//     Deleted objects are remembered (cache.tombstone_ttl/tombstone_max).
//     Handlers only signal; pods with a waiting container are queued for a
//     pod-status diagnosis (enrich.DiagnosePod), shipped like Events.
//   - A container with a readiness or startup probe that the pod cache
//     shows ready and did not before (a pod update that makes it ready, a
//     pod created later first seen ready, and once per term every ready
//     one of the pods listed at the term's start: the processor sweeps the
//     synced store) is shipped as a container readiness occurrence for a
//     sandbox's pod (enrich.ContainersReady): the only end of a probe
//     blocker, since a probe that passes again writes no Event. Never one
//     per pod update; the queue is bounded and overflow is counted
//     (eventpipe_agent_ready_dropped_total) and logged.
//   - An Event is attributed through a cached object only when the uids
//     agree: after a sandbox was deleted and created again under its name,
//     Events of the old pod (named by uid) go to the old id through the
//     remembered objects, or unattributed, never to the new one. A Sandbox
//     CR seen deleted (watch, relisting, or another uid under its name) is
//     shipped as a deletion occurrence (enrich.SandboxDeleted) through a
//     bounded queue; overflow is counted
//     (eventpipe_agent_deletion_dropped_total) and logged.
//   - Refusals for good never stall shipping (shipper.go): an occurrence the
//     collector refuses (Ack.rejected), a batch it refuses whole (a
//     BatchRejection detail, or found by sending one batch per stream when
//     an older collector names none) and an occurrence that cannot be
//     encoded are dead-lettered and skipped: counted
//     (eventpipe_agent_dead_letter_total{reason}), logged at ERROR with the
//     event_id, and kept in a bounded in-memory ring (the newest 256, each
//     occurrence cut at 16 KiB) served as JSON lines at /debug/deadletter.
//     Memory, not a file: the agent is a stateless Deployment, so the log
//     line is the durable record and the counter is what alerts. Every other
//     status is transient: the batch is re-sent with backoff.
//   - The Lease elector writes only the spec fields it owns and sends the
//     rest of the object back as read (labels, annotations, fields it does
//     not know), guarded by the resourceVersion.
//   - Cluster-context rules (pullcontext.go) change a pull failure's
//     diagnosis from Events around it (a pod's FailedToRetrieveImagePullSecret
//     makes its ambiguous failures unauthorized), in the processor, with
//     bounded state and no API call.
//   - Registry checks (verify:, off by default) run beside the processor,
//     never in it: the processor only looks a failing image up in the
//     verifier's cache (upgrading the occurrence in place) or queues it
//     (bounded; overflow counted); a worker asks the registry and hands the
//     processor an update of the same diagnosis (pullverify.go). The
//     supervisor-image check reads the OpenShell gateway's workload every
//     interval and ships a check occurrence when the answer changes
//     (supervisor.go, supervisorimage.go).
//   - Only the Lease holder watches and ships (when leader election is on);
//     losing the Lease stops both at once, and a new leader resumes from the
//     collector's cursor.
//
// Agent.Run owns every goroutine it starts and returns when its context ends.
package agent

// Package diagnosis answers "what blocks this sandbox?" from the collector's
// Follow stream alone: it folds the occurrences of each sandbox into a
// Diagnosis (its blockers: an image that cannot be pulled, workload or
// supervisor, or one of the other blockers of Occurrence.blocker: the pod is
// unschedulable, a volume is not bound or mounted, its creation is refused,
// a container keeps dying; with the cause, the object it names, attempts,
// since when, retrying or persistent, and the fix) and groups
// supervisor-image failures across the sandboxes of a gateway. It is what
// `eventpipe diagnose` prints and what `make run` shows live; it needs only
// the collector's address and a reader token, no kubectl.
//
// It reads the Follow stream like any other consumer (the gateway proxy
// does too), so it lives with the destinations. The fix texts come from
// api/remedy (pull failures) and the occurrence's own blocker.fix: enrich
// decides what an event means, this package only keeps the latest meaning
// per sandbox, and imports nothing upstream of the sinks.
//
// Contract:
//   - Folder.Add takes occurrences in cursor order (the order the Follow
//     stream sends them). A pull failure of a container opens or updates
//     that container's blocker (the latest occurrence's cause, disposition
//     and attempts win: the agent's enricher already accumulates them); a
//     Pulled, Created or Started event of the same container that is not
//     older than the failure closes it; one of the workload pod's agent
//     container closes the pull blockers of its init containers too (they
//     run before it), and a report of theirs not later than it does not
//     open one again. A container that pulls another image replaces its
//     blocker. Occurrences without a sandbox id are
//     ignored (the collector never sends them).
//   - An occurrence with a blocker opens or updates the blocker of its
//     (kind, involved object, container), with the occurrence's
//     blocker.fix as the fix and the last exit code when the pod status had
//     one. It ends on an event, not older than its last sighting, that
//     shows the pod got past that stage:
//     unschedulable: Scheduled of that pod, or the kubelet pulling,
//     creating or starting a container of it;
//     volume: on a claim, ProvisioningSucceeded of that claim or Scheduled
//     of the sandbox's workload pod (the scheduler binds a pod only once
//     its claims are bound); on a pod, SuccessfulAttachVolume (attach
//     failures), SuccessfulMountVolume, or the kubelet pulling,
//     creating or starting a container of it (it mounts the volumes
//     first);
//     create_refused: SuccessfulCreate or PodCreated of the same
//     controller, the agent's sandbox condition occurrence without a
//     blocker (the Sandbox's Ready condition no longer says the API
//     server refuses its pod), or Scheduled of the sandbox's workload pod;
//     container: Started of that container; a readiness or startup
//     probe failure also ends on the agent's container readiness
//     occurrence of that container (eventpipev1.IsContainerReady: it
//     became ready, so its readiness probe passes and its startup probe
//     passed; no Event says so and nothing restarts). A liveness failure
//     does not end on it (a ready container can still fail its liveness
//     probe): the restart it causes ends it with Started. For a container that
//     started and died (crash_loop, oom_killed, exit_error, unknown)
//     Started is not enough, since the kubelet starts a crash-looping
//     container again and again: the blocker ends once the container
//     has stayed up Folder.CrashSettle (a minute) after Started with no
//     later crash reported. It is judged by Folder.Now when the
//     diagnosis is read (Folder.Active: by the clock the reader passes,
//     changing nothing). Times are compared to the second, the ending
//     event winning a tie: kubelet stamps its Events to the second, the
//     agent a pod status to the nanosecond. A report of an ended blocker
//     observed no later than the event that ended it (the scheduler's late
//     series update of a FailedScheduling after the pod started) does not
//     open it again.
//   - Several blockers of a sandbox are all shown: a supervisor image first
//     (it blocks every sandbox of the gateway), then by stage: creation,
//     the pod's claims bound, scheduling, volumes attached and mounted,
//     image pulls, containers (the earliest stage is the one to fix first:
//     the later ones cannot even be tried before it; a pod whose claim is
//     unbound is unschedulable because of it), then oldest first.
//   - Sandboxes are keyed by id. One seen deleted (an occurrence with
//     sandbox.deleted_at: the agent's deletion occurrence, or a late Event of
//     its old pods) is StateDeleted and blocks nothing; of several sandboxes
//     with one gateway, workspace and name, the newest not seen deleted
//     (by FirstSeen) is the current one and the others are ReplacedBy it
//     (StateReplaced when their deletion was missed). A name stands for the
//     current sandbox (Diagnosis.Live); nothing of an old id is folded into
//     the new one.
//   - Memory is bounded: at most MaxSandboxes sandboxes and
//     maxBlockersPerSandbox blockers per sandbox are kept; what does not
//     fit is counted (Folder.Dropped, Folder.DroppedBlockers) and reported
//     by the renderers, never silently left out. A reader that bounds the
//     sandboxes itself (the gateway proxy: MaxSandboxes 0) drops them with
//     Folder.Forget.
//   - Read replays a selection once (tail, no follow). Watcher follows it
//     live, resuming by cursor after a broken stream with backoff, and
//     reports a refusal (bad token, workspace not granted, bad request) as
//     Run's error instead of retrying it for ever.
//   - Nothing here changes anything: eventpipe reports, it never stops,
//     deletes or replaces a sandbox.
package diagnosis

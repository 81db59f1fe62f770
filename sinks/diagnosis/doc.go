// Package diagnosis answers "what blocks this sandbox?" from the collector's
// Follow stream alone: it folds the occurrences of each sandbox into a
// Diagnosis (its blockers: which image, workload or supervisor, the cause,
// attempts, since when, retrying or persistent, and the fix) and groups
// supervisor-image failures across the sandboxes of a gateway. It is what
// `eventpipe diagnose` prints and what `make run` shows live; it needs only
// the collector's address and a reader token, no kubectl.
//
// It reads the Follow stream like any other consumer (the gateway proxy
// does too), so it lives with the destinations. The fix texts come from
// enrich.Remedy: enrich decides what an event means, this package only
// keeps the latest meaning per sandbox.
//
// Contract:
//   - Folder.Add takes occurrences in cursor order (the order the Follow
//     stream sends them). A pull failure of a container opens or updates
//     that container's blocker (the latest occurrence's cause, disposition
//     and attempts win: the agent's enricher already accumulates them); a
//     Pulled, Created or Started event of the same container that is not
//     older than the failure closes it. A container that pulls another
//     image replaces its blocker. Occurrences without a sandbox id are
//     ignored (the collector never sends them).
//   - Memory is bounded: at most MaxSandboxes sandboxes and
//     maxBlockersPerSandbox blockers per sandbox are kept; what does not
//     fit is counted (Folder.Dropped) and reported by the renderers, never
//     silently left out.
//   - Read replays a selection once (tail, no follow). Watcher follows it
//     live, resuming by cursor after a broken stream with backoff, and
//     reports a refusal (bad token, workspace not granted, bad request) as
//     Run's error instead of retrying it for ever.
//   - Nothing here changes anything: eventpipe reports, it never stops,
//     deletes or replaces a sandbox.
package diagnosis

// Package loki is eventpipe's Loki sink: a sinks.Pusher that sends a batch
// of occurrences with the Loki push API (POST /loki/api/v1/push, protobuf +
// snappy by default, JSON as an option). The shared runner (sinks.Runner)
// batches, retries and moves the cursor; this package only encodes, sends
// and classifies the answer.
//
// # Why not loki-client-go, and why not the push module
//
// github.com/grafana/loki-client-go's Client.Handle only queues an entry
// and returns nil; a background goroutine batches, retries on its own and,
// after its retries, logs and drops the batch (promtail_dropped_entries_total).
// The caller can never learn that a given batch was delivered, so the
// runner could not move the cursor only after delivery. It also registers
// its metrics in the global registry from init(). Not used.
//
// The wire types of github.com/grafana/loki/pkg/push (Apache-2.0, its own
// module) build, but the module has no tagged release (pseudo-versions of
// the Loki monorepo only) and brings github.com/gogo/protobuf, an archived
// second protobuf runtime. The push request is four small messages (wire.go
// spells them out); they are written directly with
// google.golang.org/protobuf/encoding/protowire into one reused buffer,
// from the occurrence, without an intermediate object graph. The encoding is
// checked against a real server (VictoriaLogs, which decodes Loki's
// protobuf) in the tests. github.com/grafana/loki/v3 (AGPL) is never
// imported.
//
// # What is sent
//
// Stream labels are few and bounded: static pairs (job="eventpipe") and
// fields from a fixed allow list (cluster, namespace, workspace, type,
// source = reporting component, ...). Never a sandbox id, pod name or event
// id: those go in the line and in structured metadata. Label values are
// sanitised (valid UTF-8, no control characters, length-capped, quotes and
// backslashes escaped in the protobuf selector), so no field content can
// change the label set.
//
// The line is one JSON object, the occurrence's protojson form written by
// sinks/internal/jsonenc with Loki's size caps (README.md): the same
// occurrence always gives the same bytes. Structured metadata carries
// event_id, occurred_at, sandbox_id, sandbox_name, reason, pull_category,
// blocker_cause, container and image.
//
// The entry timestamp is the occurrence time. An occurrence older than
// max_age (or further ahead than max_future) is sent with the time the
// agent observed it (observed_at) instead, or with the push time when that
// is out of the window too, and keeps its own time in the line and in the
// occurred_at metadata. Line, labels, structured metadata and timestamp
// are then functions of the stored occurrence alone: a resend after a
// restart or by another replica is byte-identical, the form Loki's own
// de-duplication recognises (README.md, "Resends"). Only a push-time stamp differs
// between sends. One Push reads the clock once, so the retries and splits
// inside a Push send identical entries.
//
// # How answers are classified (sinks.Pusher contract)
//
//   - 2xx: delivered.
//   - 400 or 413: some entry is invalid. Loki validates entry by entry and
//     stores the valid ones of a refused request, so the sink splits the
//     request in halves until it isolates the refused entries, reports them
//     in a *sinks.PartialError (counted as dropped by the runner) and
//     delivers the rest. Entries re-sent by a split are exact duplicates
//     (stream, timestamp, line), which Loki drops.
//   - 429: *sinks.ThrottleError with the Retry-After hint (seconds or date).
//   - 5xx, network errors, timeouts: retryable.
//   - 401, 403 and 404: retryable by default, logged as errors with a clear
//     message (credentials, tenant, or wrong URL). These say nothing about
//     the data: the same batch is accepted as soon as the operator fixes the
//     secret or the URL, and a secret file is re-read on every push, so a
//     rotation heals without a restart. Making them permanent would drop
//     every occurrence for as long as a credential is wrong. Held, the data
//     stays in the collector's log and the sink's lag grows, which the
//     runner's metrics and /readyz show; only retention can then lose it,
//     and that loss is counted loudly. auth_errors_permanent: true turns
//     them into *sinks.PermanentError for those who prefer to drop.
//   - any other 4xx (405, 415, ...): *sinks.PermanentError.
//
// # Tenants
//
// tenant.fixed sends one X-Scope-OrgID; tenant.from_workspace sends the
// sandbox's workspace (tenant.default for unattributed occurrences) and
// makes one request per tenant. A workspace that is not a valid tenant ID
// is refused for that record only (PartialError), never rewritten into
// another tenant.
//
// Metrics (eventpipe_sink_loki_*) are registered on the given Registerer;
// to run two Loki sinks on one registerer, wrap it with
// prometheus.WrapRegistererWith(prometheus.Labels{"sink": name}, reg).
// Push is safe for concurrent use; the runner calls it from one goroutine.
package loki

// Package collector is eventpipe's collector server: it accepts batches of
// occurrences from agents (eventpipe.v1.Ingest), stores them in the durable
// log (collector/store), feeds every configured sink through its own cursor
// (sinks.Runner), and serves the follow stream (eventpipe.v1.Follow).
//
// Contract:
//   - Ingest: a Batch is acknowledged only after store.Append returned, i.e.
//     after its occurrences and the (cluster, stream) resourceVersion are
//     durable and de-duplicated by event_id. Acks are sent in the order the
//     batches arrived. At most grpc.ingest_pipeline batches per stream are
//     held between receive and ack; past that the collector stops reading
//     and gRPC flow control slows the agent. A batch the store refuses is not
//     acknowledged: the stream ends with Unavailable and the agent re-sends.
//     A batch without a cluster ends the stream with InvalidArgument.
//   - Follow: every message carries its cursor (the log offset). Each
//     subscriber reads the log at its own pace (no per-subscriber queue), so
//     a slow one is neither cut off nor skipped. Occurrences without a
//     sandbox id never reach any subscription. Records removed by retention
//     before a subscriber read them are reported: in the
//     eventpipe-lost-records header when resuming, or by ending the stream
//     with DataLoss when it happens mid-stream. A resume cursor beyond the
//     end of the log (the log was reset) is refused with OutOfRange.
//   - Auth: every RPC needs a bearer token (tokens file) or a verified client
//     certificate mapped to a role, unless auth.insecure is set. Role agent
//     may only call Ingest, and only for the clusters it was granted (every
//     Batch, every occurrence's cluster, GetCursor); role reader only
//     Follow, and only for its workspaces. Unauthenticated calls get
//     Unauthenticated, out-of-scope ones PermissionDenied; both are counted
//     by reason. The TLS certificate and client CA reload when their files
//     change (new handshakes only; open connections keep theirs).
//     A tail replay scans backwards at most follow.max_tail_scan records and
//     says where it stopped (eventpipe-tail-scanned-from header).
//     Subscribers at the same position share one read and decode of each
//     log chunk (a small bounded cache), so a fan-out decodes a record once.
//   - Lifecycle: New validates the config, opens the store, builds the sinks
//     and binds the listeners; Run starts store, sinks, then servers, and on
//     shutdown stops ingress first: no new calls, open Ship streams get the
//     acks of what they already sent and end with Unavailable, open Follow
//     streams end with Unavailable (resume by cursor), all bounded by
//     grpc.shutdown_grace; then the sinks stop, then the store closes.
//   - Reload: with WithConfigPath, changes to the config file and the tokens
//     file (watched by directory, so rename-writes and ConfigMap swaps are
//     seen) apply sink filters and auth in place; other changes are logged
//     as requiring a restart; an invalid file changes nothing.
package collector

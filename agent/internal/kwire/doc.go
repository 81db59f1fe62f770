// Package kwire decodes the Kubernetes API's wire formats straight into
// enrich's small input types, without k8s.io/api, apimachinery or client-go:
// the agent reads the API with plain HTTP and keeps only what enrich reads,
// instead of decoding every object into a full typed struct first.
//
// # Formats
//
//   - A protobuf body (Accept: application/vnd.kubernetes.protobuf) is the
//     magic "k8s\x00" followed by a runtime.Unknown whose raw is the kind's
//     message: Unwrap.
//   - A protobuf watch is a length-delimited stream (ReadFrame: 4-byte
//     big-endian length, then the frame). Each frame is a bare
//     metav1.WatchEvent (the API server's stream serializer is the raw one:
//     no magic, checked against kube-apiserver v1.37.2) whose object.raw is
//     magic + Unknown + the kind's message; DecodeWatchEvent strips both and
//     also accepts a frame wrapped in its own envelope. A JSON watch is a
//     sequence of {"type", "object"} objects (DecodeWatchEventJSON).
//   - Lists (ListItems, ListItemsJSON), metav1.Status errors (DecodeStatus,
//     DecodeStatusJSON) and bookmarks (BookmarkInfo, BookmarkInfoJSON).
//   - Objects: DecodeEvent, DecodePod, DecodePVC, DecodeNamespace (protobuf),
//     DecodeSandboxJSON (the Sandbox CR has no protobuf form) and
//     DecodeAPIResourceNamesJSON (discovery).
//
// # Contract
//
//   - Pure functions over bytes: no I/O, no global state, safe for
//     concurrent use.
//   - The results equal what client-go's typed decoding followed by the
//     agent's former conversion (toEnrichEvent, the informer transform,
//     stripSandbox) gives, field for field: times as metav1.Time and
//     MicroTime decode them (whole seconds; microseconds; an empty message is
//     the zero time), merge semantics for repeated messages, unknown fields
//     skipped. The equivalence tests check this against the typed path.
//   - Malformed input (wrong wire types on the fields read, truncation,
//     lengths past the end) is an *Error naming what was being decoded, e.g.
//     "kwire: Pod.spec.containers[2]: truncated"; never a panic. Fields that
//     are skipped are not validated.
//   - Strings in results are copies: the caller may reuse its buffer. Byte
//     slices returned by the envelope functions (raw, object, list items)
//     alias their input.
//   - Fields nobody reads (managedFields, spec.volumes, ...) are skipped
//     without building anything for them. DecodeEvent makes one allocation
//     (all of an Event's strings); DecodePod about 15 for a sandbox pod.
//
// Figures against the typed path (bench/agent-kwire.md): an Event in about
// half the CPU time (1 allocation instead of 28), a sandbox pod in under a
// third (15 allocations instead of 313, 2 KB instead of 21 KB).
package kwire

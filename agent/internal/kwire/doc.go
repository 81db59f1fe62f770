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
//   - A protobuf watch is a length-delimited stream (ReadFrame): each frame is
//     a metav1.WatchEvent whose object.raw is again magic + Unknown + the
//     kind's message (DecodeWatchEvent strips both). A JSON watch is a
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
//     without building anything for them.
package kwire

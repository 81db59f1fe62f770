package enrich

import (
	mathbits "math/bits"
	"strings"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// maxClassifyBytes bounds the work ClassifyPull does on a hostile message.
const maxClassifyBytes = 16 << 10

// pullReason: kubelet reasons (Event reasons and container waiting reasons)
// that are image-pull failures by themselves. Switches, not maps: every
// event asks, and a switch on a few strings costs a length compare.
func pullReason(reason string) bool {
	switch reason {
	case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
		"RegistryUnavailable", "SignatureValidationFailed":
		return true
	}
	return false
}

// successReason: reasons that never carry a pull failure even when the
// message mentions pulling.
func successReason(reason string) bool {
	switch reason {
	case "Pulling", "Pulled", "Created", "Started", "Scheduled", "Killing", "SandboxChanged":
		return true
	}
	return false
}

// candidateReason: reasons that may carry a pull failure in their message
// (kubelet's Failed, BackOff and InspectFailed, the old FailedSync wrapper,
// a sandbox image pull in FailedCreatePodSandBox). Other reasons are only
// scanned when they mention Pull or Image (e.g. a driver's
// ImagePullFailed); the rest (Unhealthy, Killing, FailedMount, ...) never
// are, which keeps the common case cheap. "failed" is the kubelet's reason
// before 1.0 (2015), which wrote its reasons in lower case.
func candidateReason(reason string) bool {
	switch reason {
	case "", "Failed", "failed", "BackOff", "InspectFailed", "FailedSync", "FailedCreatePodSandBox", "ImageInspectError":
		return true
	}
	return strings.Contains(reason, "Pull") || strings.Contains(reason, "Image")
}

// pullMarkers in a (lower-cased) message make an event of another reason
// (Failed, BackOff, FailedSync, FailedCreatePodSandBox, InspectFailed, ...)
// a pull failure.
var pullMarkers = []string{
	"failed to pull image",
	"back-off pulling image",
	"error pulling image",
	"errimagepull",
	"imagepullbackoff",
	"invalidimagename",
	"errimageneverpull",
	"imageinspecterror",
	"failed to apply default image tag",
	"pull policy of never",
	"signaturevalidationfailed",
	"pull access denied",
	"failed to pull and unpack image",
	"failed to inspect image",
	"failed to inspect sandbox image",
	"failed to get sandbox image",
	"failed pulling image",
	"image pull failed for",
	"pull qps exceeded",
	// Runtime wordings that only a pull produces, for events that carry
	// just the cause.
	"reading manifest",
	"pinging container registry",
	"pinging docker registry",
	"error pinging docker registry",
	"toomanyrequests",
	"initializing source docker://",
	"failed to resolve reference",
	"error pulling image configuration",
	"manifest unknown",
	"not found in repository",
	"short name mode is enforcing",
	"did not resolve to an alias",
	"error unpacking image",
	"unpack image on snapshotter",
	// The kubelet's ErrImageNotEnsured (KubeletEnsureSecretPulledImages):
	// the image is on the node but the pod lacks the credential it was
	// pulled with, and the pull policy (Never) forbids pulling it again.
	"does not have the proper auth",
	// A registry API request for a manifest (distribution's
	// /v2/<name>/manifests/<reference>): only a pull or its resolve asks
	// for one. Old dockershim sandbox pulls with a keyring credential print
	// the daemon's error alone ("Failed create pod sandbox: ... Error
	// response from daemon: Get https://<host>/v2/<name>/manifests/<tag>:
	// ...", the kubelet's aggregate of one attempt).
	"/manifests/",
	// The Docker daemon's answer to a registry request of a pull (its ping
	// of the API root first, "Get https://<host>/v2/: <error>"): a report
	// that kept only that ("Error response from daemon: Get
	// https://k8s.gcr.io/v2/: net/http: request canceled ...") names no
	// image, but the only HTTP requests the daemon makes for a pod are a
	// pull's. Not the bare URL: a probe of a registry pod prints it too.
	"from daemon: get http", "from daemon: head http",
}

// rule maps message fragments to a category; rules are tried in order, the
// first with a matching fragment wins. The order resolves messages that
// name several things:
//   - the node's own limits and stores (disk full, the kubelet's pull QPS,
//     the snapshotter) before what the registry said, so a store's "content
//     digest ...: not found" is not an image that does not exist;
//   - the network (DNS, connect, "connection timed out", "i/o timeout",
//     "TLS handshake timeout") before timeout: a registry that cannot be
//     reached is registry_unreachable whatever word for time appears;
//     timeout is left for a pull that ran past its deadline or was
//     cancelled;
//   - "pull access denied ... may require docker login" is
//     not_found_or_unauthorized, not unauthorized;
//   - Docker's "API error (500)" is the daemon's own answer to the
//     kubelet, its status for any failure, not the registry's: it is the
//     last rule, taken only when the message names no other cause.
//
// Bare status numbers ("401", "503") are never fragments: they occur in
// digests and account ids.
type rule struct {
	category  string
	fragments []string
	// strength is how sure a match of this rule alone is: certain,
	// likely (words other causes share) or weak (words that name no cause
	// by themselves: the answer is unrecognised).
	strength strength
}

var rules = []rule{
	{eventpipev1.CategoryNeverPull, []string{"pull policy of never", "errimageneverpull"}, certain},
	// containerd: the registry's Docker-Content-Digest header does not
	// parse ("\"x\" in header not a valid digest: invalid checksum digest
	// format"): the registry's answer is broken, the reference is fine.
	{eventpipev1.CategoryRegistryUnreachable, []string{"in header not a valid digest"}, certain},
	{eventpipev1.CategoryInvalidReference, []string{
		"invalidimagename", "invalid reference format", "couldn't parse image", "could not parse image",
		"failed to apply default image tag", "repository name must be lowercase", "invalid image name",
		"repository name must have at least one component", "invalid repository name", "invalid tag format",
		"parsing image name", "invalid checksum digest format", "invalid digest", "invalid image reference",
		"docker reference must not",
	}, certain},
	{eventpipev1.CategoryPolicyRejected, []string{
		"signaturevalidationfailed", "source image rejected", "rejected by policy",
		"policy requirements", "not allowed by policy", "blocked by policy", "denied by policy",
		"image is not allowed", "is not in the allowed",
		// CRI-O / Podman short-name policy (registries.conf).
		"short name mode is enforcing", "returns ambiguous list", "did not resolve to an alias",
		"no unqualified-search registries", "short-name resolution enforced",
		// CRI-O before containers/image's short names (1.10-1.15): no
		// registry to complete an unqualified name with.
		"no registries configured",
		// containers/image: registries.conf blocks the registry.
		"is blocked in /",
		// containerd (1.7+ transfer service) image verifier plugins.
		"image verifier",
		// Harbor's pull policies (vulnerability prevention, required
		// cosign/Notation/Notary signatures): PROJECTPOLICYVIOLATION, sent as
		// HTTP 412, which a HEAD shows without its message.
		"due to configured policy", "is not signed by", "is not signed in notary",
		"projectpolicyviolation", "412 precondition failed",
	}, certain},
	// Any other mention of a signature (containers/image's "Error reading
	// signatures", a verifier's "no valid signature") is the signature
	// policy too, unless every one is the query parameter of a signed
	// download URL (CloudFront's "Signature=", S3's "X-Amz-Signature=",
	// GCS's "X-Goog-Signature="), which a failed blob fetch prints whole:
	// see pullScan. Its own rule, so that case can drop its bit.
	{eventpipev1.CategoryPolicyRejected, []string{signatureFragment}, likely},
	{eventpipev1.CategoryPlatformMismatch, []string{
		"no match for platform", "does not match the specified platform", "no matching manifest for",
		"no image found in manifest list for architecture", "image operating system", "cannot be used on this platform",
		"not supported on this platform", "no matching platform", "platform mismatch",
		// Windows containerd unpacking a Linux layer.
		"hcsshim::processbaselayer",
		// containers/image with an OCI index; Docker's OS and Windows
		// build checks; containerd's platform filter leaving nothing.
		"no image found in image index for", "cannot download image with operating system",
		"based image is incompatible with a", "image might be filtered out",
		// Docker 1.12-1.13 and old containers/image: the manifest list has
		// no entry for the node's OS and architecture.
		"no supported platform found in manifest list",
	}, certain},
	// A Docker image manifest v2 schema 1 image: containerd 2.0 disabled
	// and 2.1 removed pulling it (the schema 1 "converter"), Docker 26
	// disabled it. The image exists; its format is refused.
	{eventpipev1.CategoryUnsupportedFormat, []string{
		"schema 1 images", "schema 1 support", "failed to get converter", "manifest.v1+prettyjws",
		"schema 1 image manifests", "schema 1 not supported",
		// containerd refuses a manifest over its 4 MiB limit ("rejecting N
		// byte manifest for R: not found"): the image is there, its manifest
		// is refused; the wrapped "not found" is containerd's error kind.
		"byte manifest for",
		// Docker: the reference names an artifact (a Helm chart, a plugin),
		// not an image ("Encountered remote \"...\"(plugin) when fetching").
		"encountered remote",
		// containerd: a layer media type it has no processor for (an
		// encrypted layer, zstd on an old containerd), or no image media type
		// at all.
		"no processor for media-type", "unrecognised mediatype",
	}, certain},
	{eventpipev1.CategoryNodeStorage, []string{
		"no space left on device", "disk quota exceeded", "not enough space", "insufficient space",
		"read-only file system", "disk pressure", "out of disk", "quota exceeded for",
		// Docker's devicemapper thin pool below its free-space minimum.
		"thin pool has",
	}, certain},
	{eventpipev1.CategoryKubeletThrottled, []string{"pull qps exceeded"}, certain},
	{eventpipev1.CategoryRateLimited, []string{
		"toomanyrequests", "too many requests", "rate limit", "ratelimit", "status 429", "429 too many",
		"code=429", "status code 429", "statuscode: 429", "http 429 response",
	}, certain},
	// A cancelled pull is timeout even when the runtime was unpacking
	// ("failed to extract layer ...: context canceled").
	{eventpipev1.CategoryTimeout, []string{"context canceled"}, certain},
	{eventpipev1.CategoryRuntimeStore, []string{
		"failed to extract layer", "failed to prepare extraction snapshot", "unpack image on snapshotter",
		"error unpacking image", "content store", "failed to register layer", "parent snapshot",
		"/var/lib/docker/overlay2", "nil pointer to a runtime api image", "locking ref", "failed to unpack image",
		// containerd's content store refused to commit a downloaded blob
		// (a stale partial download in its ingest directory; cleared on the
		// node, not by the registry).
		"failed commit on ref", "unexpected commit digest",
		// The content store's own directory (an ingest lost under it:
		// "failed reading status of resume write: stat .../ingest/...").
		"io.containerd.content.v1.content", "status of resume write",
		// containerd's unpacker and snapshotter, and its image store after
		// a pull; containers/storage applying a layer (CRI-O); Docker's
		// download verification and an inspect with no image record.
		"failed to stat snapshot", "failed to commit snapshot", "calculated on extraction",
		"unexpected commit size", "from containerd image store", "processing tar file",
		"adding layer with blob", "layer verification failed", "unable to inspect image",
		// The kubelet's gRPC connection to the runtime itself: its socket
		// refused or missing, or the runtime gone mid-call. Before the
		// network rules: no registry was asked.
		"transport: error while dialing", "dial unix /", "error reading from server",
		"is the docker daemon running",
	}, certain},
	{eventpipev1.CategoryRegistryUnreachable, []string{
		"i/o timeout", "tls handshake timeout", "connection timed out", "connection refused", "no such host",
		"no route to host", "network is unreachable", "dial tcp", "dial udp", "server misbehaving",
		"temporary failure in name resolution", "name resolution", "request canceled while waiting for connection",
		"awaiting headers", "connection reset", "proxyconnect",
		// A registry request (not the whole pull) that got no answer in time:
		// a context ended on one request, or the transport's wait for the
		// response headers (net/http's ResponseHeaderTimeout).
		`": context deadline exceeded`, "timeout awaiting response headers",
		// containerd's hosts configuration left no host to ask.
		"no resolve hosts", "no pull hosts",
		// Docker 1.x's v1 index.
		"network timed out",
	}, certain},
	{eventpipev1.CategoryTimeout, []string{
		"deadline exceeded", "deadlineexceeded", "timeout exceeded", "timed out",
		"slow image pulling", "image pull progress", "request canceled", "code = canceled",
	}, certain},
	{eventpipev1.CategoryTLSError, []string{
		"x509:", "tls:", "certificate", "server gave http response to https client", "ssl", "handshake failure",
		// net/http's "http: server gave HTTP response to HTTPS client" is
		// the only error that starts so: a report that cut it keeps this.
		"http: server gave",
	}, certain},
	{eventpipev1.CategoryRegistryUnreachable, []string{
		"unexpected eof", "broken pipe", "service unavailable", "bad gateway", "gateway timeout",
		"internal server error", "unavailable desc", "registryunavailable", "cannot connect", "could not connect",
		"couldn't connect", "connection closed", "pinging container registry", "pinging docker registry",
		"could not reach any registry endpoint", "api error (502)", "api error (503)",
		"status: 502", "status: 503", "status 502", "status 503", ": 502 ", ": 503 ",
		// Docker's ping of both API versions: after the TLS rule, so a
		// certificate error it wraps decides.
		"unable to ping registry endpoint", "error pinging registry",
		// containers/image: a 5xx whose body is not a registry error
		// ("StatusCode: 503, \"...\"", "error parsing HTTP 502 response body").
		"statuscode: 500", "statuscode: 502", "statuscode: 503", "statuscode: 504",
		"http 500 response", "http 502 response", "http 503 response", "http 504 response",
		// A connection closed with no answer (Go's bare EOF after the URL);
		// HTTP/2 connection and stream resets; Docker 1.x's v1 layer fetch.
		": eof", "server sent goaway", "stream error: stream id", "server error: status",
		// The kubelet's RegistryUnavailable message.
		"because the registry is unavailable",
		// Go's HTTP client gave up on a registry that redirects in a loop.
		"stopped after 10 redirects",
	}, certain},
	// The registry challenged with Basic auth and the runtime had no
	// credential for it (Docker's registry client; containerd's authorizer,
	// "authorization failed: no basic auth credentials", which containerd
	// wraps in its "pull access denied, repository does not exist or may
	// require authorization" guess). No registry serves a Basic-auth
	// challenge to anonymous pulls of public images (Docker Hub, GHCR and
	// Quay answer with Bearer), so the missing credential is the cause:
	// before the anonymous-refusal rule.
	{eventpipev1.CategoryUnauthorized, []string{"no basic auth credentials"}, certain},
	{eventpipev1.CategoryNotFoundOrUnauthorized, []string{
		"pull access denied", "requested access to the resource is denied", "may require 'docker login'",
		"may require \"docker login\"", "may require authorization", "repository does not exist or may require",
		"insufficient_scope", "not found or unauthorized", "does not exist or no pull access",
		// Quay answers so for a repository that does not exist as well.
		"access to the requested resource is not authorized",
		// GHCR's anonymous refusal as containerd 2 appends it to the status
		// ("403 Forbidden\ndenied: denied").
		"denied: denied",
		// likely, not certain: the category is two-sided by definition, so
		// the words cannot settle which side the user must act on; the
		// agent's cluster context or a registry check can.
	}, likely},
	// A credential the registry was given and refused, and the kubelet's
	// own check of the pod's credentials: certain.
	{eventpipev1.CategoryUnauthorized, []string{
		"invalid username/password", "incorrect username or password", "authentication failed",
		// The kubelet's ErrImageNotEnsured.
		"does not have the proper auth",
	}, certain},
	// A refusal as a status or a word (401, 403, "unauthorized",
	// "denied:"): likely, not certain. Registries answer an anonymous
	// request for a repository that does not exist the same way (GCR's
	// and GHCR's token endpoints, a private project), so the words do not
	// tell a missing image from a missing credential.
	{eventpipev1.CategoryUnauthorized, []string{
		"unauthorized", "authentication required", "403 forbidden",
		"forbidden", "failed to authorize", "access denied", "access to the resource is denied",
		"authorization failed",
		"denied: permission", "permission \"", "permissiondenied", "permission denied", "unauthenticated",
		"credentials", "denied:", "status 401", "status 403", "status: 401", "status: 403",
		": 401 ", ": 403 ", "(401)", "(403)",
		// containers/image: a status without a registry error body, and
		// bearer challenges it cannot complete.
		"statuscode: 401", "statuscode: 403", "http 401 response", "http 403 response",
		"bearer auth challenge", "decoding bearer token",
		// containerd 1.1-1.3's authorizer: a registry's Bearer challenge
		// without a scope (a private repository answering an anonymous
		// request); 1.4 and later only log it and go on.
		"no scope specified for token auth challenge",
	}, likely},
	{eventpipev1.CategoryNotFound, []string{
		"not found", "manifest unknown", "code = notfound", "name unknown", "does not exist",
		"no such image", "blob unknown", "unknown manifest", "notfound", "status 404", "status: 404",
		": 404 ", "(404)", "statuscode: 404",
		// Distribution's NAME_UNKNOWN message as containers/image prints it,
		// and its client's ErrBlobUnknown (Docker: "error pulling image
		// configuration: unknown blob").
		"repository name not known to registry", "unknown blob",
		// containers/image when a 404's body is not a registry error (a
		// CDN's HTML page): "error parsing HTTP 404 response body".
		"http 404 response",
		// GCR's answer to Docker's v1 fallback, which Docker tries after a
		// v2 manifest request answered MANIFEST_UNKNOWN, NAME_UNKNOWN or
		// UNAUTHORIZED (moby distribution/errors.go, shouldV2Fallback):
		// "Status 405 ... v1 Registry API is disabled. If you are not
		// explicitly using the v1 Registry API, it is possible your v2
		// image could not be found."; the registry's own reading decides.
		"v2 image could not be found",
		// A registry that withdrew a version says so in its error message
		// ("unknown: This container version is no longer available from
		// ..."): the reference is no longer served.
		"no longer available",
	}, certain},
	// Last resorts: Docker's "API error (500)" and containerd's "failed to
	// do request" wrap whatever failed (a refused credential, a 403 on a
	// redirect's token, a connection that failed); they yield to any other
	// rule, and alone they name no cause: weak, so such a message is
	// unrecognised rather than a guess at the registry.
	{eventpipev1.CategoryRegistryUnreachable, []string{"api error (500)", "failed to do request"}, weak},
}

// detailsMarker: old Docker messages put a guess first ("this may be
// because there are no credentials on this request") and the registry's
// answer after it; the answer decides.
const detailsMarker = "details: ("

// aggregateMarker opens the kubelet's aggregate of pull attempts
// ("[rpc error: ..., rpc error: ...]"): one attempt per credential it
// holds for the registry, each answered on its own; attemptSep starts
// every attempt after the first. See attemptsCategory.
const (
	aggregateMarker = "[rpc error: code ="
	attemptSep      = ", rpc error: code ="
)

// mirrorsMarker opens containers/image's error when registries.conf
// mirrors were tried before the image's own registry (CRI-O, Podman):
// "(Mirrors also failed: [m1: err1]\n[m2: err2]): <ref>: <err>". Each
// source answered on its own; see mirrorsBits.
const (
	mirrorsMarker = "(mirrors also failed: "
	mirrorSep     = "]\n["
	mirrorsEnd    = "]): "
)

// markerBit tags pullMarkers in the matcher, detailsBit detailsMarker,
// aggregateBit aggregateMarker, mirrorsBit mirrorsMarker; rule i has bit
// 1<<i.
const (
	markerBit    = 1 << 31
	detailsBit   = 1 << 30
	aggregateBit = 1 << 29
	mirrorsBit   = 1 << 28
	specialBits  = markerBit | detailsBit | aggregateBit | mirrorsBit
)

var pullMatcher = func() *matcher {
	var frags []fragment
	for _, f := range pullMarkers {
		frags = append(frags, fragment{f, markerBit})
	}
	frags = append(frags, fragment{detailsMarker, detailsBit}, fragment{aggregateMarker, aggregateBit},
		fragment{mirrorsMarker, mirrorsBit})
	for i, r := range rules {
		for _, f := range r.fragments {
			frags = append(frags, fragment{f, 1 << uint(i)})
		}
	}
	return newMatcher(frags)
}()

// signatureFragment is the fragment of the signature rule; signatureBit
// its rule's bit.
const signatureFragment = "signature"

var signatureBit = func() uint32 {
	for i, r := range rules {
		if len(r.fragments) == 1 && r.fragments[0] == signatureFragment {
			return 1 << uint(i)
		}
	}
	panic("enrich: no signature rule")
}()

// pullScan is pullMatcher.scan, without the signature rule's bit when
// every "signature" in s outside the image reference is a signed URL's
// query parameter (see bareSignature).
func pullScan(s, image, short string) uint32 {
	bits := pullMatcher.scan(s, image, short)
	if bits&signatureBit != 0 && !bareSignature(s, image, short) {
		bits &^= signatureBit
	}
	return bits
}

// bareSignature reports whether s, without the image reference (image and
// short, which the matcher skips too), mentions a signature other than as
// a URL query parameter ("Signature=", "X-Amz-Signature="). Only asked
// when the signature rule matched, which is rare, so its copies cost
// nothing on the common path.
func bareSignature(s, image, short string) bool {
	if image != "" {
		s = strings.ReplaceAll(s, image, "\x00")
	}
	if short != "" {
		s = strings.ReplaceAll(s, short, "\x00")
	}
	for off := 0; off < len(s); {
		i := pullIndexFold(s[off:], signatureFragment)
		if i < 0 {
			return false
		}
		off += i + len(signatureFragment)
		if off >= len(s) || s[off] != '=' {
			return true
		}
	}
	return false
}

// ClassifyPull classifies one (reason, message) pair from an Event or a
// container waiting state; ok=false when it is not an image-pull failure.
// category is one of the Category* constants; image is the reference the
// message names, normalised (NormalizeImage; empty when it names none);
// detail is the runtime's own words for the cause (empty when the message
// names none). PullVerdict says in addition how sure the category is.
func ClassifyPull(reason, message string) (category, image, detail string, ok bool) {
	v, ok := PullVerdict(reason, message)
	return v.Category, v.Image, v.Detail, ok
}

// Verdict is the text rules' decision on one pull-failure message.
type Verdict struct {
	// Category is a Category* constant: unknown when the message names no
	// cause, unrecognised when its words do not decide one (Confidence is
	// then weak).
	Category string
	// Image is the reference the message names, normalised.
	Image string
	// Detail is the runtime's own words for the cause.
	Detail string
	// Confidence is a Confidence* constant (see confidence).
	Confidence string
}

// PullVerdict is ClassifyPull with the confidence of its answer.
func PullVerdict(reason, message string) (Verdict, bool) {
	if len(message) > maxClassifyBytes {
		message = message[:maxClassifyBytes]
	}
	return classifyPull(reason, message, imageFromMessage(message))
}

// classifyPull is PullVerdict with the kubelet's quoted image
// (imageFromMessage) already extracted.
func classifyPull(reason, message, image string) (v Verdict, ok bool) {
	bits, img, combined, ok := pullBits(reason, message, image)
	if !ok {
		return Verdict{}, false
	}
	v.Image = img
	var st strength
	v.Category, st = decide(reason, message, bits, combined)
	v.Confidence = st.String()
	if v.Category != eventpipev1.CategoryUnknown {
		v.Detail = pullDetail(message)
	}
	return v, true
}

// pullBits scans a message for the rules: ok=false when it is not a pull
// failure; bits are the rule bits that decide (the best attempt of an
// aggregate, the registry's answer after a guess), without specialBits.
//
// combined: the bits are those of several sources (the kubelet's
// attempts, containers/image's mirrors), each of which answered on its own;
// the rank and the rule order choose among them, so rules of different
// sources that matched together are no disagreement.
func pullBits(reason, message, image string) (bits uint32, img string, combined, ok bool) {
	isPullReason := pullReason(reason)
	if !isPullReason && (successReason(reason) || !candidateReason(reason)) {
		return 0, "", false, false
	}
	short := ""
	if image != "" {
		if s := shortImage(image); s != image {
			short = s
		}
	}
	bits = pullScan(message, image, short)
	if !isPullReason && bits&markerBit == 0 && !oldDockerNotFound(message) {
		return 0, "", false, false
	}
	if image == "" {
		// The kubelet quoted no image: take it from the runtime's words,
		// and scan again without it (it must not classify).
		if image = imageFromCause(message); image != "" {
			if s := shortImage(image); s != image {
				short = s
			}
			bits = pullScan(message, image, short)
		}
	}
	img = NormalizeImage(image)
	if bits&aggregateBit != 0 {
		if b := attemptsBits(message, image, short); b != 0 {
			bits, combined = b, true
		}
	} else if bits&mirrorsBit != 0 {
		if b := mirrorsBits(message, image, short); b != 0 {
			bits, combined = b, true
		}
	} else if bits&detailsBit != 0 {
		// The registry's answer after "details: (" wins over the guess
		// before it, when it names a cause.
		i := strings.Index(message, detailsMarker)
		if i < 0 {
			i = pullIndexFold(message, detailsMarker)
		}
		if d := pullScan(message[i:], image, short) &^ specialBits; d != 0 {
			bits = d
		}
	}
	return bits &^ specialBits, img, combined, true
}

// strength is how sure a rule's match is; the order is from sure to not.
type strength uint8

const (
	certain strength = iota
	likely
	weak
)

func (s strength) String() string {
	switch s {
	case certain:
		return eventpipev1.ConfidenceCertain
	case likely:
		return eventpipev1.ConfidenceLikely
	}
	return eventpipev1.ConfidenceWeak
}

// precedence says which rules of different categories may match one
// message together, and how sure the first of them (the rule order
// decides) still is: the pairs the rule order was written to resolve
// (see rules). Any other pair is a disagreement between the rules, and the
// answer is unrecognised. A weak rule never disagrees: it yields.
var precedence = map[[2]string]strength{
	// The node's own limits and stores before what the registry said:
	// containerd's errdefs kinds ("...: not found") wrap the node's error.
	{eventpipev1.CategoryNodeStorage, eventpipev1.CategoryRuntimeStore}:         certain,
	{eventpipev1.CategoryRuntimeStore, eventpipev1.CategoryNotFound}:            certain,
	{eventpipev1.CategoryPlatformMismatch, eventpipev1.CategoryNotFound}:        certain,
	{eventpipev1.CategoryPlatformMismatch, eventpipev1.CategoryRuntimeStore}:    certain,
	{eventpipev1.CategoryUnsupportedFormat, eventpipev1.CategoryNotFound}:       certain,
	{eventpipev1.CategoryNeverPull, eventpipev1.CategoryNotFound}:               certain,
	{eventpipev1.CategoryInvalidReference, eventpipev1.CategoryNotFound}:        likely,
	{eventpipev1.CategoryRuntimeStore, eventpipev1.CategoryRegistryUnreachable}: certain, // the runtime's socket, no registry
	{eventpipev1.CategoryUnsupportedFormat, eventpipev1.CategoryRuntimeStore}:   certain, // "failed to extract layer ...: no processor for media-type"
	// A registry's answer that does not parse, or no host to ask
	// (containerd's "no resolve hosts: not found"), or a token endpoint
	// that cannot be reached ("failed to authorize: failed to fetch
	// anonymous token: ... no such host"): the registry was not reached.
	{eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryInvalidReference}: certain,
	{eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryNotFound}:         certain,
	{eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryUnauthorized}:     certain,
	// CRI-O's "short-name resolution enforced" holds the network rule's
	// "name resolution"; a signature that could not be fetched is the
	// policy's to report, but the words do not say more: likely.
	{eventpipev1.CategoryPolicyRejected, eventpipev1.CategoryRegistryUnreachable}: likely,
	// The network before timeout: a connection that timed out is
	// unreachable; a certificate error before the ping that wraps it.
	{eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryTimeout}:  certain,
	{eventpipev1.CategoryTLSError, eventpipev1.CategoryRegistryUnreachable}: certain,
	{eventpipev1.CategoryTLSError, eventpipev1.CategoryUnauthorized}:        likely,
	// A cancelled pull is timeout whatever it was doing.
	{eventpipev1.CategoryTimeout, eventpipev1.CategoryRegistryUnreachable}: likely,
	{eventpipev1.CategoryTimeout, eventpipev1.CategoryRuntimeStore}:        certain,
	// A 429's text says "denied" or "unauthorized" too.
	{eventpipev1.CategoryRateLimited, eventpipev1.CategoryUnauthorized}: likely,
	// "pull access denied ... does not exist or may require docker login":
	// the two-sided category's own words name both sides.
	{eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.CategoryUnauthorized}: certain,
	{eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.CategoryNotFound}:     certain,
	// "no basic auth credentials" inside containerd's two-sided guess.
	{eventpipev1.CategoryUnauthorized, eventpipev1.CategoryNotFoundOrUnauthorized}: certain,
}

// decide turns the rule bits into a category and its confidence: the
// first matching rule's category, as sure as that rule and the
// precedences that account for the others that matched (each must be
// preceded by the first or by one already accounted for: "no basic auth
// credentials" accounts for containerd's two-sided guess, whose words
// account for its "does not exist"); unrecognised when a rule is accounted
// for by none (the rules disagree) or only a weak one matched. With no rule, the kubelet's
// reason decides, else the message names no cause (unknown) or names one
// no rule reads (unrecognised). combined bits (see pullBits) never
// disagree: a pair with no precedence makes the answer likely.
func decide(reason, message string, bits uint32, combined bool) (category string, s strength) {
	first := -1
	var accounted uint32 // rules whose category the answer accounts for
	for b := bits; b != 0; b &= b - 1 {
		i := mathbits.TrailingZeros32(b)
		r := &rules[i]
		switch {
		case first < 0 || rules[first].strength == weak && r.strength != weak:
			// The first rule, or one a weak first rule yields to.
			first, s, accounted = i, r.strength, 1<<uint(i)
		case r.strength == weak || r.category == rules[first].category:
		default:
			p, ok := accountedFor(accounted, r.category)
			switch {
			case ok:
				s = max(s, p)
				accounted |= 1 << uint(i)
			case combined:
				s = max(s, likely)
			default:
				return eventpipev1.CategoryUnrecognised, weak
			}
		}
	}
	switch {
	case first >= 0 && s == weak:
		return eventpipev1.CategoryUnrecognised, weak
	case first >= 0:
		category = rules[first].category
	case reason == "InvalidImageName":
		return eventpipev1.CategoryInvalidReference, certain
	case reason == "ErrImageNeverPull":
		return eventpipev1.CategoryNeverPull, certain
	case reason == "RegistryUnavailable":
		return eventpipev1.CategoryRegistryUnreachable, likely
	case reason == "SignatureValidationFailed":
		return eventpipev1.CategoryPolicyRejected, certain
	case deniedOnly(message):
		return eventpipev1.CategoryNotFoundOrUnauthorized, likely
	case causeless(message):
		return eventpipev1.CategoryUnknown, weak
	default:
		return eventpipev1.CategoryUnrecognised, weak
	}
	if category == eventpipev1.CategoryUnauthorized && quayRefusal(message) {
		category, s = eventpipev1.CategoryNotFoundOrUnauthorized, max(s, likely)
	}
	if category == eventpipev1.CategoryRegistryUnreachable && dockerSocketDeadline(message) {
		category = eventpipev1.CategoryTimeout
	}
	return category, s
}

// accountedFor finds a precedence of one of the accounted rules'
// categories over category, and the best strength it gives.
func accountedFor(accounted uint32, category string) (strength, bool) {
	best, found := weak, false
	for b := accounted; b != 0; b &= b - 1 {
		if p, ok := precedence[[2]string{rules[mathbits.TrailingZeros32(b)].category, category}]; ok && (!found || p < best) {
			best, found = p, true
		}
	}
	return best, found
}

// causeless reports whether a pull failure's message names no cause at
// all: the kubelet's back-off ("Back-off pulling image \"x\""), its
// prefix with the runtime's words cut off ("Failed to pull image \"x\"",
// "failed to pull and unpack image \"x"), a bare reason ("ImagePullBackOff",
// "Error: ImageInspectError"), "image pull failed for unknown error",
// "<nil>", or the pre-1.5 FailedSync wrapper around one of these. Such a
// message is unknown; a message with words no rule reads is unrecognised.
func causeless(message string) bool {
	d := strings.TrimSpace(pullDetail(message))
	if hasPrefixFold(d, "error syncing pod") {
		// `... with ImagePullBackOff: "Back-off pulling image \"x\""`
		i := strings.LastIndex(d, `: "`)
		if i < 0 {
			return false
		}
		d = strings.TrimSpace(strings.ReplaceAll(strings.Trim(d[i+3:], `"`), `\"`, `"`))
	}
	for _, w := range [...]string{"", "<nil>", "imagepullbackoff", "errimagepull", "imageinspecterror", "image pull failed for unknown error"} {
		if strings.EqualFold(d, w) {
			return true
		}
	}
	for _, p := range [...]string{"back-off pulling image ", "failed to pull image ", "failed to pull and unpack image ", "failed to inspect image "} {
		if hasPrefixFold(d, p) {
			// Only the image follows: no ": " and its cause.
			return !strings.Contains(d[len(p):], ": ")
		}
	}
	return false
}

// attemptsBits is the rule bits of the best answered attempts of the
// kubelet's aggregate (aggregateMarker), 0 when the message holds no
// aggregate. The pull failed because every attempt failed; the attempt that
// got furthest says what still stops it with the right credential: an
// answer about the image (not found, wrong platform, ...) ranks first, a
// refused credential next (the other attempts' credentials do not fit the
// registry), and a server error, a transport failure or no cause last
// (they say nothing about the image or the credential). Within one rank
// the rule order decides, as for a single message.
func attemptsBits(message, image, short string) uint32 {
	start := strings.Index(message, aggregateMarker)
	if start < 0 {
		return 0
	}
	best := rankedBits{rank: attemptRanks}
	for rest := message[start+1:]; rest != ""; {
		attempt := rest
		rest = ""
		if i := strings.Index(attempt[1:], attemptSep); i >= 0 {
			attempt, rest = attempt[:i+1], attempt[i+3:]
		}
		best.take(pullScan(attempt, image, short) &^ specialBits)
	}
	return best.bits
}

// rankedBits keeps the rule bits of the best-ranked sources of an
// aggregate (attemptRank): a better rank replaces what was kept, an equal
// one adds its bits, so the rule order decides among equals.
type rankedBits struct {
	bits uint32
	rank int
}

func (k *rankedBits) take(bits uint32) {
	switch r := attemptRank(ruleCategory(bits)); {
	case r < k.rank:
		k.bits, k.rank = bits, r
	case r == k.rank:
		k.bits |= bits
	}
}

// mirrorsBits is the rule bits of the best answered sources of
// containers/image's mirrors error (mirrorsMarker), 0 when the message
// holds none: every mirror and the image's own registry failed, and, as
// for the kubelet's attempts, the source that got furthest says what
// stops the pull (a mirror that answers "manifest unknown" while the
// origin is unreachable, as in a disconnected cluster, is an image
// missing from the mirror, not a network failure).
func mirrorsBits(message, image, short string) uint32 {
	start := strings.Index(message, "(Mirrors also failed: ")
	if start < 0 {
		if start = pullIndexFold(message, mirrorsMarker); start < 0 {
			return 0
		}
	}
	rest := message[start+len(mirrorsMarker):]
	end := strings.LastIndex(rest, mirrorsEnd)
	if end < 0 {
		return 0
	}
	best := rankedBits{rank: attemptRanks}
	for mirrors := rest[:end]; mirrors != ""; {
		part := mirrors
		mirrors = ""
		if i := strings.Index(part, mirrorSep); i >= 0 {
			part, mirrors = part[:i], part[i+len(mirrorSep):]
		}
		best.take(pullScan(part, image, short) &^ specialBits)
	}
	best.take(pullScan(rest[end+len(mirrorsEnd):], image, short) &^ specialBits) // the image's own registry
	return best.bits
}

// attemptRanks is the number of ranks attemptRank gives.
const attemptRanks = 3

// attemptRank orders the answers of one attempt of an aggregate (see
// attemptsBits): 0 an answer about the image or the node, 1 a refused
// credential, 2 a server error, a transport failure or no cause.
func attemptRank(category string) int {
	switch category {
	case eventpipev1.CategoryUnauthorized, eventpipev1.CategoryNotFoundOrUnauthorized:
		return 1
	case eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryTimeout, eventpipev1.CategoryTLSError,
		eventpipev1.CategoryRateLimited, eventpipev1.CategoryUnknown:
		return 2
	}
	return 0
}

// deniedOnly reports whether the registry's whole answer is a bare
// "denied" at the end of the message (GHCR refusing an anonymous request
// for a package that is private or does not exist: "Head
// \"https://ghcr.io/v2/o/i/manifests/t\": denied"). It cannot tell the two
// apart, so the category is not_found_or_unauthorized. Only asked when no
// rule matched: "denied: <reason>" keeps its own rules.
func deniedOnly(message string) bool {
	return strings.HasSuffix(strings.TrimRight(message, " \t\r\n"), ": denied")
}

// quayStatus is Quay's status line for a refused request: Quay is a Flask
// application, and Werkzeug writes the reason phrase in upper case (Go
// servers write "401 Unauthorized"). Runtimes that show only the status
// (containerd's "pulling from host quay.io failed with status code
// [manifests T]: 401 UNAUTHORIZED", "unexpected status from HEAD request to
// ...: 401 UNAUTHORIZED") show Quay's anonymous refusal, whose body ("access
// to the requested resource is not authorized") is the same for a private
// repository and a missing one.
const quayStatus = "401 UNAUTHORIZED"

// quayRefusal reports whether an unauthorized message is Quay's refusal of
// a registry request (quayStatus, case as written), not of its token
// endpoint: a token request answered 401 is a refused credential.
func quayRefusal(message string) bool {
	return strings.Contains(message, quayStatus) && pullIndexFold(message, "token") < 0
}

// oldDockerNotFound: Docker 1.x's v1 pull ("Error: image R[:T] not found",
// its answer to the index's 404 for the repository), which kubelets of
// 2015 put alone into a waiting message with no reason. Only the whole
// message counts: the wording carries no other pull marker.
func oldDockerNotFound(message string) bool {
	return strings.HasPrefix(message, oldDockerNotFoundPrefix) && strings.HasSuffix(message, " not found")
}

const oldDockerNotFoundPrefix = "Error: image "

// dockerSocketDeadline: the request that ran out of time is the kubelet's
// (dockershim's, cri-dockerd's) own image pull call to the Docker daemon
// ("Post \"http://%2Fvar%2Frun%2Fdocker.sock/v1.41/images/create?...\":
// context deadline exceeded"), not a registry request: the whole pull
// ran past the CRI call's deadline, so timeout, not registry_unreachable.
func dockerSocketDeadline(message string) bool {
	i := strings.LastIndex(message, dockerDeadline)
	if i < 0 {
		return false
	}
	j := strings.LastIndexByte(message[:i], '"')
	if j < 0 {
		return false
	}
	url := message[j+1 : i]
	return strings.Contains(url, "docker.sock/") && strings.Contains(url, "/images/create")
}

const dockerDeadline = `": context deadline exceeded`

// ruleCategory is the category of the first rule whose bit is set.
func ruleCategory(bits uint32) string {
	for i, r := range rules {
		if bits&(1<<uint(i)) != 0 {
			return r.category
		}
	}
	return eventpipev1.CategoryUnknown
}

// pullIndexFold is strings.Index for an ASCII lower-case sep, ignoring case.
func pullIndexFold(s, sep string) int {
	for i := 0; i+len(sep) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sep)], sep) {
			return i
		}
	}
	return -1
}

// shortImage strips docker.io/ and library/ as Docker's messages do.
func shortImage(img string) string {
	img = strings.TrimPrefix(img, "docker.io/")
	return strings.TrimPrefix(img, "library/")
}

// containsAny is the slow reference the matcher is tested against.

// pullDetail extracts the most specific part of a pull-failure message: after
// the last `": ` (the runtime wraps each cause in "<what> \"ref\": ") and the
// gRPC `desc = `, without the daemon's prefix.
func pullDetail(msg string) string {
	s := msg
	if i := lastIndex(s, `desc = `); i >= 0 {
		s = s[i+len(`desc = `):]
	}
	if i := lastIndex(s, `": `); i >= 0 && i+3 < len(s) {
		s = s[i+3:]
	}
	for _, p := range []string{"Error response from daemon: ", "ErrImagePull: ", "Error: "} {
		s = strings.TrimPrefix(s, p)
	}
	s = strings.TrimSpace(s)
	out, _ := truncateUTF8(s, 512)
	return out
}

// lastIndex is strings.LastIndex by repeated forward strings.Index, which
// is vectorised: the separators occur a few times in a message, and the
// backward Rabin-Karp scan of strings.LastIndex was most of pullDetail.
func lastIndex(s, sep string) int {
	last := -1
	for off := 0; ; {
		i := strings.Index(s[off:], sep)
		if i < 0 {
			return last
		}
		last = off + i
		off = last + 1
	}
}

func containsAny(s string, frags []string) bool {
	for _, f := range frags {
		if strings.Contains(s, f) {
			return true
		}
	}
	return false
}

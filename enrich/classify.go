package enrich

import (
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
// are, which keeps the common case cheap.
func candidateReason(reason string) bool {
	switch reason {
	case "", "Failed", "BackOff", "InspectFailed", "FailedSync", "FailedCreatePodSandBox", "ImageInspectError":
		return true
	}
	return strings.Contains(reason, "Pull") || strings.Contains(reason, "Image")
}

// pullMarkers in a (lower-cased) message make an event of another reason
// (Failed, BackOff, FailedSync, FailedCreatePodSandBox, ...) a pull failure.
var pullMarkers = []string{
	"failed to pull image",
	"back-off pulling image",
	"error pulling image",
	"errimagepull",
	"imagepullbackoff",
	"invalidimagename",
	"errimageneverpull",
	"failed to apply default image tag",
	"pull policy of never",
	"signaturevalidationfailed",
	"pull access denied",
	"failed to pull and unpack image",
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
}

// rule maps message fragments to a category; rules are tried in order, the
// first with a matching fragment wins. The order resolves messages that
// name several things (a TLS handshake timeout is a timeout; "pull access
// denied ... may require docker login" is not_found_or_unauthorized, not
// unauthorized).
type rule struct {
	category  string
	fragments []string
}

var rules = []rule{
	{eventpipev1.CategoryNeverPull, []string{"pull policy of never", "errimageneverpull"}},
	{eventpipev1.CategoryInvalidReference, []string{
		"invalidimagename", "invalid reference format", "couldn't parse image", "could not parse image",
		"failed to apply default image tag", "repository name must be lowercase", "invalid image name",
		"repository name must have at least one component", "invalid repository name", "invalid tag format",
		"parsing image name", "invalid checksum digest format", "invalid digest", "invalid image reference",
		"docker reference must not",
	}},
	{eventpipev1.CategoryPolicyRejected, []string{
		"signaturevalidationfailed", "source image rejected", "rejected by policy", "signature",
		"policy requirements", "not allowed by policy", "blocked by policy", "denied by policy",
		"image is not allowed", "is not in the allowed",
	}},
	{eventpipev1.CategoryPlatformMismatch, []string{
		"no match for platform", "does not match the specified platform", "no matching manifest for",
		"no image found in manifest list for architecture", "image operating system", "cannot be used on this platform",
		"not supported on this platform", "no matching platform", "platform mismatch",
	}},
	{eventpipev1.CategoryNodeStorage, []string{
		"no space left on device", "disk quota exceeded", "not enough space", "insufficient space",
		"read-only file system", "disk pressure", "out of disk", "quota exceeded for",
	}},
	{eventpipev1.CategoryRateLimited, []string{
		"toomanyrequests", "too many requests", "rate limit", "ratelimit", "status 429", "429 too many",
		"code=429", "status code 429",
	}},
	{eventpipev1.CategoryTimeout, []string{
		"deadline exceeded", "deadlineexceeded", "i/o timeout", "tls handshake timeout", "timeout exceeded",
		"timed out", "timeout awaiting", "request canceled while waiting for connection",
		"slow image pulling", "image pull progress", "context canceled",
	}},
	{eventpipev1.CategoryTLSError, []string{
		"x509:", "tls:", "certificate", "server gave http response to https client", "ssl", "handshake failure",
	}},
	{eventpipev1.CategoryRegistryUnreachable, []string{
		"connection refused", "no such host", "no route to host", "network is unreachable",
		"connection reset", "server misbehaving", "temporary failure in name resolution",
		"dial tcp", "dial udp", "unexpected eof", "broken pipe", "service unavailable", "bad gateway",
		"internal server error", "503", "502", "500 internal", "unavailable desc", "registryunavailable",
		"cannot connect", "could not connect", "couldn't connect", "connection closed", "name resolution",
		"pinging container registry", "pinging docker registry",
	}},
	{eventpipev1.CategoryNotFoundOrUnauthorized, []string{
		"pull access denied", "requested access to the resource is denied", "may require 'docker login'",
		"may require \"docker login\"", "may require authorization", "repository does not exist or may require",
		"insufficient_scope", "not found or unauthorized", "does not exist or no pull access",
	}},
	{eventpipev1.CategoryUnauthorized, []string{
		"unauthorized", "authentication required", "no basic auth credentials", "401", "403 forbidden",
		"forbidden", "failed to authorize", "access denied", "access to the resource is denied",
		"invalid username/password", "incorrect username or password", "authorization failed",
		"denied: permission", "permission \"", "permissiondenied", "permission denied", "unauthenticated",
		"credentials", "authentication failed", "denied:",
	}},
	{eventpipev1.CategoryNotFound, []string{
		"not found", "manifest unknown", "code = notfound", "name unknown", "does not exist",
		"no such image", "404", "blob unknown", "unknown manifest", "notfound",
	}},
}

// markerBit tags pullMarkers in the matcher; rule i has bit 1<<i.
const markerBit = 1 << 31

var pullMatcher = func() *matcher {
	var frags []fragment
	for _, f := range pullMarkers {
		frags = append(frags, fragment{f, markerBit})
	}
	for i, r := range rules {
		for _, f := range r.fragments {
			frags = append(frags, fragment{f, 1 << uint(i)})
		}
	}
	return newMatcher(frags)
}()

// ClassifyPull classifies one (reason, message) pair from an Event or a
// container waiting state; ok=false when it is not an image-pull failure.
// category is one of the Category* constants; image is the reference the
// message names (may be empty); detail is the runtime's own words for the
// cause (empty when the message names none).
func ClassifyPull(reason, message string) (category, image, detail string, ok bool) {
	if len(message) > maxClassifyBytes {
		message = message[:maxClassifyBytes]
	}
	return classifyPull(reason, message, imageFromMessage(message))
}

// classifyPull is ClassifyPull with the message's image already extracted.
func classifyPull(reason, message, image string) (category, img, detail string, ok bool) {
	isPullReason := pullReason(reason)
	if !isPullReason && (successReason(reason) || !candidateReason(reason)) {
		return "", "", "", false
	}
	short := ""
	if image != "" {
		if s := shortImage(image); s != image {
			short = s
		}
	}
	bits := pullMatcher.scan(message, image, short)
	if !isPullReason && bits&markerBit == 0 {
		return "", "", "", false
	}
	img = image
	category = eventpipev1.CategoryUnknown
	for i, r := range rules {
		if bits&(1<<uint(i)) != 0 {
			category = r.category
			break
		}
	}
	if category == eventpipev1.CategoryUnknown {
		switch reason {
		case "InvalidImageName":
			category = eventpipev1.CategoryInvalidReference
		case "ErrImageNeverPull":
			category = eventpipev1.CategoryNeverPull
		case "RegistryUnavailable":
			category = eventpipev1.CategoryRegistryUnreachable
		case "SignatureValidationFailed":
			category = eventpipev1.CategoryPolicyRejected
		}
	}
	if category != eventpipev1.CategoryUnknown {
		detail = pullDetail(message)
	}
	return category, img, detail, true
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

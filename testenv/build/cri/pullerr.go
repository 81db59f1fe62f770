package cri

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ref is an image reference split as containerd and containers/image
// normalise it: docker.io for a name without a registry, library/ for a
// one-element Docker Hub name, latest when neither tag nor digest is given.
type ref struct {
	domain string // docker.io, ghcr.io, registry.example.internal:5000
	path   string // library/busybox
	tag    string // "" when only a digest is given
	digest string // sha256:...
}

func parseRef(s string) (ref, error) {
	if s == "" || strings.ContainsAny(s, " \t\n") {
		return ref{}, fmt.Errorf("invalid reference %q", s)
	}
	var r ref
	rest := s
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		r.digest = rest[i+1:]
		rest = rest[:i]
		if !strings.HasPrefix(r.digest, "sha256:") {
			return ref{}, fmt.Errorf("invalid digest in %q", s)
		}
	}
	if i := strings.IndexByte(rest, '/'); i > 0 && (strings.ContainsAny(rest[:i], ".:") || rest[:i] == "localhost") {
		r.domain, rest = rest[:i], rest[i+1:]
	} else {
		r.domain = "docker.io"
	}
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		r.tag, rest = rest[i+1:], rest[:i]
	}
	if rest == "" || r.tag == "" && strings.HasSuffix(s, ":") {
		return ref{}, fmt.Errorf("invalid reference %q", s)
	}
	if r.domain == "docker.io" && !strings.Contains(rest, "/") {
		rest = "library/" + rest
	}
	r.path = rest
	if r.tag == "" && r.digest == "" {
		r.tag = "latest"
	}
	return r, nil
}

// normalized is the full reference (docker.io/library/busybox:1.36).
func (r ref) normalized() string {
	s := r.domain + "/" + r.path
	if r.tag != "" {
		s += ":" + r.tag
	}
	if r.digest != "" {
		s += "@" + r.digest
	}
	return s
}

// repo is the repository without tag or digest (docker.io/library/busybox).
func (r ref) repo() string { return r.domain + "/" + r.path }

// object is what a manifest request names: the digest, else the tag.
func (r ref) object() string {
	if r.digest != "" {
		return r.digest
	}
	return r.tag
}

// apiHost is the host the registry API is asked at: Docker Hub's API lives
// at registry-1.docker.io.
func (r ref) apiHost() string {
	if r.domain == "docker.io" {
		return "registry-1.docker.io"
	}
	return r.domain
}

// defaultAddr is the address a network failure names when the rule gives
// none: a private address on the reference's port (443 without one).
func (r ref) defaultAddr() string {
	port := "443"
	if i := strings.LastIndexByte(r.domain, ':'); i >= 0 {
		port = r.domain[i+1:]
	}
	return "10.20.30.40:" + port
}

// pullError is the error a runtime returns for a failed pull of image (as
// the pod spec writes it) with outcome rule.Pull. Every wording is one line
// of enrich/testdata/pullvocab/vocab.jsonl (cited per case; the test
// TestPullErrorsAreVocabulary renders each for that line's image and
// compares): containerd 2.1's resolver and CRI plugin, CRI-O 1.36 with
// containers/image 5.36.
func pullError(runtime string, image string, rule ImageRule) error {
	r, err := parseRef(image)
	if err != nil {
		// Not reached: the kubelet refuses a name that does not parse
		// (InvalidImageName) before it asks the runtime.
		return status.Errorf(codes.Internal, "eventpipe testenv CRI: %v", err)
	}
	addr := rule.Addr
	if addr == "" {
		addr = r.defaultAddr()
	}
	platform := rule.Platform
	if platform == "" {
		platform = "linux/amd64"
	}
	if runtime == CRIO {
		return crioPullError(r, rule.Pull, addr, platform)
	}
	return containerdPullError(r, rule.Pull, addr)
}

// containerdPullError: containerd 2.x wraps every pull error in "failed to
// pull and unpack image %q" (internal/cri/server/images/image_pull.go) and
// the resolver's in "failed to resolve reference %q"; errdefs.ErrNotFound
// becomes gRPC NotFound, the rest Unknown.
func containerdPullError(r ref, outcome, addr string) error {
	n := r.normalized()
	resolve := fmt.Sprintf("failed to pull and unpack image %q: failed to resolve reference %q: ", n, n)
	head := fmt.Sprintf("https://%s/v2/%s/manifests/%s", r.apiHost(), r.path, r.object())
	doRequest := fmt.Sprintf("failed to do request: Head %q: ", head)
	switch outcome {
	case PullNotFound: // vocab line 1 (containerd 1.3-2.x, 404 on every host)
		return status.Error(codes.NotFound, resolve+n+": not found")
	case PullUnauthorized: // vocab line 57 (unexpected status ... 401)
		return status.Error(codes.Unknown, resolve+"unexpected status from HEAD request to "+head+": 401 Unauthorized")
	case PullRateLimited: // vocab line 56 (429 on the manifest HEAD)
		return status.Error(codes.Unknown, resolve+"unexpected status from HEAD request to "+head+": 429 Too Many Requests")
	case PullTLS: // vocab line 20
		return status.Error(codes.Unknown, resolve+doRequest+"tls: failed to verify certificate: x509: certificate signed by unknown authority")
	case PullDNS: // vocab line 11 (the cluster DNS at 10.96.0.10)
		return status.Error(codes.Unknown, resolve+doRequest+"dial tcp: lookup "+hostOnly(r.apiHost())+" on 10.96.0.10:53: no such host")
	case PullConnectionRefused: // vocab line 13
		return status.Error(codes.Unknown, resolve+doRequest+"dial tcp "+addr+": connect: connection refused")
	case PullIOTimeout: // vocab line 12
		return status.Error(codes.Unknown, resolve+doRequest+"dial tcp "+addr+": i/o timeout")
	case PullPlatformMismatch: // vocab line 102
		return status.Errorf(codes.NotFound, "failed to pull and unpack image %q: no match for platform in manifest: not found", n)
	}
	return status.Errorf(codes.Internal, "eventpipe testenv CRI: no containerd wording for pull outcome %q", outcome)
}

// crioPullError: CRI-O 1.36 returns containers/image's error chain, code
// Unknown; "initializing source docker://<ref>" opens a docker transport
// source, which first pings the registry.
func crioPullError(r ref, outcome, addr, platform string) error {
	n := r.normalized()
	src := "initializing source docker://" + n + ": "
	manifest := fmt.Sprintf("reading manifest %s in %s: ", r.object(), r.repo())
	ping := fmt.Sprintf("pinging container registry %s: Get %q: ", r.apiHost(), "https://"+r.apiHost()+"/v2/")
	var msg string
	switch outcome {
	case PullNotFound: // vocab line 180 (CRI-O 1.33-1.36)
		msg = "unable to pull image: " + src + manifest + "manifest unknown"
	case PullUnauthorized: // vocab line 124 (UNAUTHORIZED, default message)
		msg = src + manifest + "authentication required"
	case PullRateLimited: // vocab line 126 (TOOMANYREQUESTS, default message)
		msg = src + manifest + "too many requests"
	case PullTLS: // vocab line 143
		msg = src + ping + "tls: failed to verify certificate: x509: certificate signed by unknown authority"
	case PullDNS: // vocab line 141 (the node's resolver at 10.0.0.2)
		msg = src + ping + "dial tcp: lookup " + hostOnly(r.apiHost()) + " on 10.0.0.2:53: no such host"
	case PullConnectionRefused: // vocab line 172 (CRI-O 1.28+ marks ECONNREFUSED RegistryUnavailable)
		msg = "RegistryUnavailable: " + src + ping + "dial tcp " + addr + ": connect: connection refused"
	case PullIOTimeout: // vocab line 142
		msg = src + ping + "dial tcp " + addr + ": i/o timeout"
	case PullPlatformMismatch: // vocab line 164 (containers/image 5.30+: "image index")
		p := strings.SplitN(platform, "/", 3)
		variant := ""
		if len(p) == 3 {
			variant = p[2]
		}
		msg = fmt.Sprintf("choosing an image from manifest list docker://%s: no image found in image index for architecture %q, variant %q, OS %q", n, p[1], variant, p[0])
	default:
		return status.Errorf(codes.Internal, "eventpipe testenv CRI: no CRI-O wording for pull outcome %q", outcome)
	}
	return status.Error(codes.Unknown, msg)
}

// hostOnly drops a port: DNS looks up the name alone.
func hostOnly(hostport string) string {
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		return hostport[:i]
	}
	return hostport
}

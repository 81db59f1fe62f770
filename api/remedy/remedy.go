// Package remedy turns a diagnosed cause into the next step a user should
// take: one line naming the image, tag or registry and where it is
// configured (the sandbox, the gateway's supervisor image setting, the
// node). It is text over the shared category vocabulary of
// api/eventpipe/v1, so every stage can show it: enrich decides the cause,
// eventpipe diagnose and the gateway proxy show the fix.
package remedy

import (
	"strings"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// Input is what Remedy needs to know about one failed image pull. Every
// field but Category may be empty.
type Input struct {
	// Category is a PullFailure.category (a Category* constant).
	Category string
	// Image is the reference that failed to pull.
	Image string
	// ImageRole is the Occurrence.image_role: workload, supervisor,
	// bootstrap, init or unknown.
	ImageRole string
	// Node is the node whose runtime failed (the Event's source host).
	Node string
	// Detail is the runtime's own words for the cause (PullFailure.detail).
	Detail string
}

// ImageRef is an image reference split the way a container runtime reads
// it: docker.io is the registry when the first path element names no host,
// and latest the tag when neither a tag nor a digest is given.
type ImageRef struct {
	Registry   string // e.g. ghcr.io, docker.io, localhost:5000
	Repository string // e.g. nvidia/openshell/supervisor, library/busybox
	Tag        string // empty when the reference pins only a digest
	Digest     string // sha256:..., or empty
}

// ParseImageRef splits ref. It never fails: a reference it cannot make sense
// of ends up in Repository, so a remedy still names it.
func ParseImageRef(ref string) ImageRef {
	var r ImageRef
	rest := strings.TrimSpace(ref)
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		r.Digest, rest = rest[i+1:], rest[:i]
	}
	if i := strings.IndexByte(rest, '/'); i > 0 {
		first := rest[:i]
		if strings.ContainsAny(first, ".:") || first == "localhost" {
			r.Registry, rest = first, rest[i+1:]
		}
	}
	if r.Registry == "" {
		r.Registry = "docker.io"
	}
	// The tag follows the last ':' after the last '/' (a port has a '/'
	// after it).
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		r.Tag, rest = rest[i+1:], rest[:i]
	}
	if r.Registry == "docker.io" && rest != "" && !strings.Contains(rest, "/") {
		rest = "library/" + rest
	}
	r.Repository = rest
	if r.Tag == "" && r.Digest == "" {
		r.Tag = "latest"
	}
	return r
}

// Name is registry/repository, the place a tag or digest lives in.
func (r ImageRef) Name() string {
	if r.Repository == "" {
		return r.Registry
	}
	return r.Registry + "/" + r.Repository
}

// version is "tag T" or "digest D" (a digest pins the content, so it is
// what must exist when both are given).
func (r ImageRef) version() string {
	if r.Digest != "" {
		return "digest " + r.Digest
	}
	return "tag " + r.Tag
}

// remedyText writes the next step for one category.
type remedyText func(in Input, ref ImageRef, owner string) string

// remedies is the fix per pull-failure category: one short, actionable
// next step naming the image, tag or registry. One entry per category; a
// category added to the classifier gets its line here (TestRemedyCoversEveryCategory).
var remedies = map[string]remedyText{
	eventpipev1.CategoryNotFound: func(_ Input, r ImageRef, owner string) string {
		return r.version() + " does not exist in " + r.Name() + ": " + owner
	},
	eventpipev1.CategoryUnauthorized: func(_ Input, r ImageRef, owner string) string {
		return r.Registry + " refused the pull of " + r.Name() + " (no or wrong credentials): add an imagePullSecret for " +
			r.Registry + " to the sandbox's namespace or service account, or fix the one there; " + owner
	},
	eventpipev1.CategoryNotFoundOrUnauthorized: func(_ Input, r ImageRef, owner string) string {
		return r.Name() + ":" + strings.TrimPrefix(r.version(), "tag ") + " does not exist or needs credentials: " +
			"check the name and tag (" + owner + "); if it is private, add an imagePullSecret for " + r.Registry
	},
	eventpipev1.CategoryRegistryUnreachable: func(in Input, r ImageRef, _ string) string {
		return r.Registry + " is not reachable from " + nodeName(in.Node) + withDetail(in.Detail) +
			": check DNS, proxy and firewall from the node to the registry, or mirror the image; the kubelet keeps retrying"
	},
	eventpipev1.CategoryTLSError: func(in Input, r ImageRef, _ string) string {
		return "TLS to " + r.Registry + " failed on " + nodeName(in.Node) + withDetail(in.Detail) +
			": install the registry's CA on the nodes (containerd certs.d) or give the registry a trusted certificate"
	},
	eventpipev1.CategoryRateLimited: func(_ Input, r ImageRef, _ string) string {
		return r.Registry + " rate-limits pulls of " + r.Name() + ": pull with credentials (an imagePullSecret for " +
			r.Registry + ") or from a mirror; the kubelet retries when the limit resets"
	},
	eventpipev1.CategoryInvalidReference: func(in Input, _ ImageRef, owner string) string {
		return "\"" + in.Image + "\" is not a valid image reference (lower-case repository, tag after ':', digest after '@'): " + owner
	},
	eventpipev1.CategoryNeverPull: func(in Input, _ ImageRef, _ string) string {
		return "imagePullPolicy is Never and " + in.Image + " is not on " + nodeName(in.Node) +
			": load the image onto the node, or allow pulls (imagePullPolicy IfNotPresent)"
	},
	eventpipev1.CategoryPlatformMismatch: func(in Input, r ImageRef, _ string) string {
		return r.Name() + " has no build for the platform of " + nodeName(in.Node) +
			": publish a multi-arch image (or one for the node's OS/architecture), or schedule on matching nodes"
	},
	eventpipev1.CategoryNodeStorage: func(in Input, _ ImageRef, _ string) string {
		return nodeName(in.Node) + " has no room to store " + in.Image +
			": free the node's image storage (crictl rmi --prune) or give it a larger disk"
	},
	eventpipev1.CategoryPolicyRejected: func(in Input, r ImageRef, owner string) string {
		if d := strings.ToLower(in.Detail); strings.Contains(d, "short name") || strings.Contains(d, "short-name") {
			return "the runtime on " + nodeName(in.Node) + " refuses the short name " + in.Image +
				" (registries.conf short-name mode is enforcing, or no unqualified-search registry): write the image fully qualified (registry/repository:tag); " + owner
		}
		if detailHas(in.Detail, "is blocked in /") {
			return "the registries configuration (registries.conf) on " + nodeName(in.Node) + " blocks " + r.Registry +
				": pull " + in.Image + " from an allowed registry or mirror, or unblock the registry on the nodes; " + owner
		}
		if detailHas(in.Detail, "due to configured policy", "projectpolicyviolation", "412 precondition failed", "is not signed by", "is not signed in notary") {
			return r.Registry + " refuses to serve " + in.Image + " by its own pull policy (e.g. Harbor's vulnerability or signature rules)" +
				": scan or sign the image there, exempt it in the registry project's policy, or use an allowed image; " + owner
		}
		return "a signature or admission policy rejected " + in.Image +
			": sign the image or allow it in the policy, or use an allowed image (" + owner + ")"
	},
	eventpipev1.CategoryTimeout: func(in Input, r ImageRef, _ string) string {
		return "pulling " + in.Image + " timed out on " + nodeName(in.Node) +
			": check the bandwidth to " + r.Registry + ", use a closer mirror or a smaller image; the kubelet keeps retrying"
	},
	eventpipev1.CategoryKubeletThrottled: func(in Input, _ ImageRef, _ string) string {
		return "the kubelet on " + nodeName(in.Node) + " held back the pull of " + in.Image +
			" (its own pull rate limit, registryPullQPS/registryBurst; no registry refused it): it retries by itself; if it persists, raise registryPullQPS in the node's kubelet configuration or pre-pull the images"
	},
	eventpipev1.CategoryRuntimeStore: func(in Input, _ ImageRef, _ string) string {
		if detailHas(in.Detail, "dial unix", "transport: error while dialing", "error reading from server", "is the docker daemon running") {
			return "the container runtime on " + nodeName(in.Node) + " is not answering the kubelet" + withDetail(in.Detail) +
				": check that containerd, CRI-O or Docker is running on the node and read its log; the kubelet retries the pull of " + in.Image + " when it is back"
		}
		return "the container runtime on " + nodeName(in.Node) + " could not unpack or read " + in.Image + " in its image store" + withDetail(in.Detail) +
			": the image is not at fault; read the runtime's log on the node, remove the image there (crictl rmi) or drain and recycle the node"
	},
	eventpipev1.CategoryUnsupportedFormat: func(in Input, r ImageRef, owner string) string {
		switch {
		case detailHas(in.Detail, "encrypted"):
			return in.Image + " has encrypted layers the runtime on " + nodeName(in.Node) +
				" cannot decrypt: give the runtime the decryption keys (imgcrypt), or use an unencrypted image; " + owner
		case detailHas(in.Detail, "no processor for media-type"):
			return in.Image + " uses a layer media type the runtime on " + nodeName(in.Node) + " cannot unpack (e.g. zstd on an old containerd)" +
				": upgrade the runtime, or push the image with gzip layers; " + owner
		case detailHas(in.Detail, "byte manifest for"):
			return "the manifest of " + in.Image + " is larger than the runtime on " + nodeName(in.Node) +
				" accepts (containerd's 4 MiB limit): use an image with a smaller manifest (fewer platforms or layers); " + owner
		case detailHas(in.Detail, "encountered remote", "unrecognised mediatype"):
			return in.Image + " is not a container image (the registry serves another kind of artifact, e.g. a Helm chart, under that name)" +
				withDetail(in.Detail) + ": " + owner
		}
		return r.Name() + ":" + strings.TrimPrefix(r.version(), "tag ") + " is a Docker schema 1 image, a format the runtime on " + nodeName(in.Node) +
			" no longer pulls (containerd 2.x, Docker 26+): use a tag published as schema 2 or OCI, or rebuild and push the image with a current builder; " + owner
	},
	eventpipev1.CategoryUnknown: func(in Input, _ ImageRef, _ string) string {
		return "the pull of " + in.Image + " failed for a reason eventpipe does not recognise" + withDetail(in.Detail) +
			": read the runtime's message (eventpipe follow -o json)"
	},
	// Unrecognised gives no step: the words matched rules of different
	// causes, or only a weak fragment, and any step would be a guess. It
	// passes on the runtime's words.
	eventpipev1.CategoryUnrecognised: func(in Input, _ ImageRef, _ string) string {
		if strings.TrimSpace(in.Detail) == "" {
			return "eventpipe cannot tell why the pull of " + in.Image + " failed: read the runtime's message (eventpipe follow -o json)"
		}
		return "eventpipe cannot tell why the pull of " + in.Image + " failed; the runtime says: " + runtimeWords(in.Detail)
	},
}

// Pull returns a short next step for a failed image pull: what is wrong,
// naming the image, tag or registry, and what to change, and where (the
// sandbox's image, the gateway's supervisor image setting, ...). An unknown
// category gets the generic text of CategoryUnknown. The result is one line.
func Pull(in Input) string {
	if in.Image == "" {
		in.Image = "the image"
	}
	f, ok := remedies[in.Category]
	if !ok {
		f = remedies[eventpipev1.CategoryUnknown]
	}
	return oneLine(f(in, ParseImageRef(in.Image), imageOwner(in.ImageRole)))
}

// imageOwner says where the image is configured, so the user knows what to
// change.
func imageOwner(role string) string {
	switch role {
	case eventpipev1.ImageRoleSupervisor:
		return "check the supervisor image setting of the gateway"
	case eventpipev1.ImageRoleBootstrap, eventpipev1.ImageRoleInit:
		return "check the gateway's " + role + " image setting"
	case eventpipev1.ImageRoleWorkload:
		return "check the image the sandbox was created with"
	case eventpipev1.ImageRolePodSandbox:
		return "check the runtime's pod sandbox (pause) image setting on the node (containerd sandbox_image, CRI-O pause_image)"
	}
	return "check the image reference in the pod spec"
}

func nodeName(n string) string {
	if n == "" {
		return "the node"
	}
	return "node " + n
}

// detailHas reports whether the runtime's words (lower-cased) contain one
// of the fragments, which are lower case.
func detailHas(detail string, frags ...string) bool {
	if detail == "" {
		return false
	}
	d := strings.ToLower(detail)
	for _, f := range frags {
		if strings.Contains(d, f) {
			return true
		}
	}
	return false
}

// withDetail appends the runtime's words, shortened: a remedy is one line.
func withDetail(d string) string {
	d = runtimeWords(d)
	if d == "" {
		return ""
	}
	return " (" + d + ")"
}

// runtimeWords is the runtime's words shortened to what fits a one-line
// remedy, cut on a UTF-8 boundary.
func runtimeWords(d string) string {
	d = strings.TrimSpace(d)
	if d == "" {
		return ""
	}
	const maxDetail = 120
	if len(d) > maxDetail {
		cut := maxDetail
		for cut > 0 && d[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
			cut--
		}
		d = d[:cut] + "..."
	}
	return d
}

func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n\t") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// Known reports whether category has a fix of its own (anything else gets
// the unknown category's).
func Known(category string) bool {
	_, ok := remedies[category]
	return ok
}

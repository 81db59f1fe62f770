package remedy

import (
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

func TestParseImageRef(t *testing.T) {
	tests := []struct {
		in   string
		want ImageRef
	}{
		{"busybox", ImageRef{"docker.io", "library/busybox", "latest", ""}},
		{"docker.io/library/busybox:0.0.0-does-not-exist", ImageRef{"docker.io", "library/busybox", "0.0.0-does-not-exist", ""}},
		{"ghcr.io/nvidia/openshell/supervisor:0.0.0", ImageRef{"ghcr.io", "nvidia/openshell/supervisor", "0.0.0", ""}},
		{"registry.internal.example:5000/team/agent:1.4", ImageRef{"registry.internal.example:5000", "team/agent", "1.4", ""}},
		{"localhost/agent", ImageRef{"localhost", "agent", "latest", ""}},
		{"team/agent", ImageRef{"docker.io", "team/agent", "latest", ""}},
		{"quay.io/a/b@sha256:abcd", ImageRef{"quay.io", "a/b", "", "sha256:abcd"}},
		{"quay.io/a/b:1.0@sha256:abcd", ImageRef{"quay.io", "a/b", "1.0", "sha256:abcd"}},
		{"registry:5000/x", ImageRef{"registry:5000", "x", "latest", ""}},
		{"", ImageRef{"docker.io", "", "latest", ""}},
	}
	for _, tt := range tests {
		if got := ParseImageRef(tt.in); got != tt.want {
			t.Errorf("ParseImageRef(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestPull(t *testing.T) {
	tests := []struct {
		name string
		in   Input
		want string
	}{
		{"supervisor bad tag", Input{Category: eventpipev1.CategoryNotFound,
			Image: "ghcr.io/nvidia/openshell/supervisor:0.0.0", ImageRole: eventpipev1.ImageRoleSupervisor},
			"tag 0.0.0 does not exist in ghcr.io/nvidia/openshell/supervisor: check the supervisor image setting of the gateway"},
		{"workload missing tag", Input{Category: eventpipev1.CategoryNotFound,
			Image: "docker.io/library/busybox:0.0.0-does-not-exist", ImageRole: eventpipev1.ImageRoleWorkload},
			"tag 0.0.0-does-not-exist does not exist in docker.io/library/busybox: check the image the sandbox was created with"},
		{"digest", Input{Category: eventpipev1.CategoryNotFound, Image: "quay.io/a/b@sha256:abcd"},
			"digest sha256:abcd does not exist in quay.io/a/b: check the image reference in the pod spec"},
		{"unreachable with node and detail", Input{Category: eventpipev1.CategoryRegistryUnreachable,
			Image: "registry.example.com/team/agent:1.4", Node: "node-7", Detail: "dial tcp: lookup registry.example.com: no such host"},
			"registry.example.com is not reachable from node node-7 (dial tcp: lookup registry.example.com: no such host): check DNS, proxy and firewall from the node to the registry, or mirror the image; the kubelet keeps retrying"},
		{"unauthorized", Input{Category: eventpipev1.CategoryUnauthorized, Image: "registry.example.com/team/private-agent:1.4",
			ImageRole: eventpipev1.ImageRoleWorkload},
			"registry.example.com refused the pull of registry.example.com/team/private-agent (no or wrong credentials): add an imagePullSecret for registry.example.com to the sandbox's namespace or service account, or fix the one there; check the image the sandbox was created with"},
		{"rate limited", Input{Category: eventpipev1.CategoryRateLimited, Image: "python:3.12-slim"},
			"docker.io rate-limits pulls of docker.io/library/python: pull with credentials (an imagePullSecret for docker.io) or from a mirror; the kubelet retries when the limit resets"},
		{"unknown category falls back", Input{Category: "made_up", Image: "x:1"},
			"the pull of x:1 failed for a reason eventpipe does not recognise: read the runtime's message (eventpipe follow -o json)"},
		{"unrecognised gives the runtime's words, no step", Input{Category: eventpipev1.CategoryUnrecognised, Image: "x:1",
			Detail: "unexpected status code 418 I'm a teapot"},
			"eventpipe cannot tell why the pull of x:1 failed; the runtime says: unexpected status code 418 I'm a teapot"},
		{"unrecognised without words", Input{Category: eventpipev1.CategoryUnrecognised, Image: "x:1"},
			"eventpipe cannot tell why the pull of x:1 failed: read the runtime's message (eventpipe follow -o json)"},
		{"no image", Input{Category: eventpipev1.CategoryNeverPull},
			"imagePullPolicy is Never and the image is not on the node: load the image onto the node, or allow pulls (imagePullPolicy IfNotPresent)"},
		{"kubelet throttled", Input{Category: eventpipev1.CategoryKubeletThrottled, Image: "python:3.12", Node: "n1"},
			"the kubelet on node n1 held back the pull of python:3.12 (its own pull rate limit, registryPullQPS/registryBurst; no registry refused it): it retries by itself; if it persists, raise registryPullQPS in the node's kubelet configuration or pre-pull the images"},
		{"short name refused", Input{Category: eventpipev1.CategoryPolicyRejected, Image: "busybox:1.36", Node: "n1",
			ImageRole: eventpipev1.ImageRoleWorkload, Detail: "short-name \"busybox:1.36\" did not resolve to an alias and no unqualified-search registries are defined"},
			"the runtime on node n1 refuses the short name busybox:1.36 (registries.conf short-name mode is enforcing, or no unqualified-search registry): write the image fully qualified (registry/repository:tag); check the image the sandbox was created with"},
		{"schema 1 image", Input{Category: eventpipev1.CategoryUnsupportedFormat, Image: "registry.k8s.io/busybox:latest", Node: "n1",
			ImageRole: eventpipev1.ImageRoleWorkload},
			"registry.k8s.io/busybox:latest is a Docker schema 1 image, a format the runtime on node n1 no longer pulls (containerd 2.x, Docker 26+): use a tag published as schema 2 or OCI, or rebuild and push the image with a current builder; check the image the sandbox was created with"},
		{"runtime not answering", Input{Category: eventpipev1.CategoryRuntimeStore, Image: "nginx:1.25", Node: "n1",
			Detail: `connection error: desc = "transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: connection refused"`},
			"the container runtime on node n1 is not answering the kubelet (connection error: desc = \"transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: connection...): check that containerd, CRI-O or Docker is running on the node and read its log; the kubelet retries the pull of nginx:1.25 when it is back"},
		{"store damaged", Input{Category: eventpipev1.CategoryRuntimeStore, Image: "nginx:1.25", Node: "n1", Detail: "failed to stat snapshot sha256:0a1b: input/output error"},
			"the container runtime on node n1 could not unpack or read nginx:1.25 in its image store (failed to stat snapshot sha256:0a1b: input/output error): the image is not at fault; read the runtime's log on the node, remove the image there (crictl rmi) or drain and recycle the node"},
		{"encrypted layers", Input{Category: eventpipev1.CategoryUnsupportedFormat, Image: "ghcr.io/a/secure:1", Node: "n1", ImageRole: eventpipev1.ImageRoleWorkload,
			Detail: "failed to get stream processor for application/vnd.oci.image.layer.v1.tar+gzip+encrypted: no processor for media-type"},
			"ghcr.io/a/secure:1 has encrypted layers the runtime on node n1 cannot decrypt: give the runtime the decryption keys (imgcrypt), or use an unencrypted image; check the image the sandbox was created with"},
		{"zstd layers", Input{Category: eventpipev1.CategoryUnsupportedFormat, Image: "ghcr.io/a/z:1", Node: "n1",
			Detail: "failed to get stream processor for application/vnd.oci.image.layer.v1.tar+zstd: no processor for media-type"},
			"ghcr.io/a/z:1 uses a layer media type the runtime on node n1 cannot unpack (e.g. zstd on an old containerd): upgrade the runtime, or push the image with gzip layers; check the image reference in the pod spec"},
		{"oversized manifest", Input{Category: eventpipev1.CategoryUnsupportedFormat, Image: "ghcr.io/a/b:1", Node: "n1",
			Detail: "rejecting 5242881 byte manifest for ghcr.io/a/b:1: not found"},
			"the manifest of ghcr.io/a/b:1 is larger than the runtime on node n1 accepts (containerd's 4 MiB limit): use an image with a smaller manifest (fewer platforms or layers); check the image reference in the pod spec"},
		{"not an image", Input{Category: eventpipev1.CategoryUnsupportedFormat, Image: "docker.io/acme/chart:1.0.0",
			Detail: `Encountered remote "application/vnd.cncf.helm.config.v1+json"(unknown) when fetching`},
			"docker.io/acme/chart:1.0.0 is not a container image (the registry serves another kind of artifact, e.g. a Helm chart, under that name) (Encountered remote \"application/vnd.cncf.helm.config.v1+json\"(unknown) when fetching): check the image reference in the pod spec"},
		{"registry blocked on the node", Input{Category: eventpipev1.CategoryPolicyRejected, Image: "docker.io/library/redis:7.2", Node: "n1",
			Detail: "registry docker.io is blocked in /etc/containers/registries.conf or /etc/containers/registries.conf.d"},
			"the registries configuration (registries.conf) on node n1 blocks docker.io: pull docker.io/library/redis:7.2 from an allowed registry or mirror, or unblock the registry on the nodes; check the image reference in the pod spec"},
		{"registry's own policy", Input{Category: eventpipev1.CategoryPolicyRejected, Image: "harbor.example/p/app:2", Node: "n1",
			Detail: "unexpected status from HEAD request to https://harbor.example/v2/p/app/manifests/2: 412 Precondition Failed"},
			"harbor.example refuses to serve harbor.example/p/app:2 by its own pull policy (e.g. Harbor's vulnerability or signature rules): scan or sign the image there, exempt it in the registry project's policy, or use an allowed image; check the image reference in the pod spec"},
		{"pause image", Input{Category: eventpipev1.CategoryNotFound, Image: "registry.k8s.io/pause:3.99", ImageRole: eventpipev1.ImageRolePodSandbox},
			"tag 3.99 does not exist in registry.k8s.io/pause: check the runtime's pod sandbox (pause) image setting on the node (containerd sandbox_image, CRI-O pause_image)"},
		{"control characters from the cluster stay on one line", Input{Category: eventpipev1.CategoryUnknown, Image: "a:1", Detail: "line1\nline2"},
			"the pull of a:1 failed for a reason eventpipe does not recognise (line1 line2): read the runtime's message (eventpipe follow -o json)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Pull(tt.in); got != tt.want {
				t.Errorf("Pull(%+v)\n got %q\nwant %q", tt.in, got, tt.want)
			}
		})
	}
}

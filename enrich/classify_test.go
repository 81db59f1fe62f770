package enrich

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// pullMessage is one entry of testdata/pull_messages.json, the first
// classifier's 79 real messages. They are the corpus's R001-R079
// (testdata/pullcorpus/prior.jsonl, which TestPullCorpus checks);
// the file stays for the tests that read it, and TestPullMessagesMatchPrior
// keeps the two the same.
type pullMessage struct {
	Runtime  string `json:"runtime"`
	Category string `json:"category"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
	Source   string `json:"source"`
	Note     string `json:"note"`
}

func loadJSON[T any](t testing.TB, path string) []T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var out []T
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return out
}

// The old test files and the corpus's R and RL entries say the same.
func TestPullMessagesMatchPrior(t *testing.T) {
	prior := map[string]corpusMessage{}
	for _, m := range loadCorpus(t) {
		prior[m.ID] = m
	}
	msgs := loadJSON[pullMessage](t, "testdata/pull_messages.json")
	if len(msgs) != 79 {
		t.Fatalf("%d messages in pull_messages.json, want 79", len(msgs))
	}
	for i, m := range msgs {
		p := prior[fmt.Sprintf("R%03d", i+1)]
		if p.Message != m.Message || p.Reason != m.Reason || p.Category != m.Category || p.Source != m.Source {
			t.Errorf("pull_messages.json entry %d differs from %s in prior.jsonl", i, fmt.Sprintf("R%03d", i+1))
		}
	}
	type neg struct{ Reason, Message, Source string }
	for i, m := range loadJSON[neg](t, "testdata/not_pull_messages.json") {
		p := prior[fmt.Sprintf("RL%02d", i+1)]
		if p.Message != m.Message || p.Reason != m.Reason || p.Kind != "lookalike" {
			t.Errorf("not_pull_messages.json entry %d differs from RL%02d in prior.jsonl", i, i+1)
		}
	}
}

var allCategories = []string{
	eventpipev1.CategoryNotFound, eventpipev1.CategoryUnauthorized, eventpipev1.CategoryNotFoundOrUnauthorized,
	eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryTLSError, eventpipev1.CategoryRateLimited,
	eventpipev1.CategoryKubeletThrottled, eventpipev1.CategoryInvalidReference, eventpipev1.CategoryNeverPull,
	eventpipev1.CategoryPlatformMismatch, eventpipev1.CategoryNodeStorage, eventpipev1.CategoryRuntimeStore,
	eventpipev1.CategoryPolicyRejected, eventpipev1.CategoryTimeout, eventpipev1.CategoryUnsupportedFormat,
	eventpipev1.CategoryUnknown, eventpipev1.CategoryUnrecognised,
}

func TestClassifyPullImageAndDetail(t *testing.T) {
	tests := []struct {
		reason, msg, image, detail string
	}{
		{"Failed", `Failed to pull image "docker.io/library/busybox:0.0.0-does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`,
			"docker.io/library/busybox:0.0.0-does-not-exist", "docker.io/library/busybox:0.0.0-does-not-exist: not found"},
		{"InvalidImageName", `Failed to apply default image tag "None:None": couldn't parse image reference "None:None": invalid reference format: repository name must be lowercase`,
			"None:None", "invalid reference format: repository name must be lowercase"},
		{"ErrImageNeverPull", `Container image "nginx:latest" is not present with pull policy of Never`, "docker.io/library/nginx:latest", `Container image "nginx:latest" is not present with pull policy of Never`},
		{"BackOff", `Back-off pulling image "selenium/hub"`, "docker.io/selenium/hub:latest", ""},
		{"FailedSync", `Error syncing pod, skipping: failed to "StartContainer" for "nginx" with ImagePullBackOff: "Back-off pulling image \"nginx\""`, "docker.io/library/nginx:latest", ""},
		{"Failed", `Failed to pull image "x/y:1": rpc error: code = Unknown desc = Error response from daemon: toomanyrequests: You have reached your pull rate limit.`, "docker.io/x/y:1", "toomanyrequests: You have reached your pull rate limit."},
	}
	for _, tt := range tests {
		_, img, detail, ok := ClassifyPull(tt.reason, tt.msg)
		if !ok || img != tt.image || detail != tt.detail {
			t.Errorf("ClassifyPull(%q, %q) = image %q detail %q ok %v; want %q %q", tt.reason, tt.msg, img, detail, ok, tt.image, tt.detail)
		}
	}
}

// The image reference must not drive the category.
func TestClassifyPullIgnoresImageName(t *testing.T) {
	cat, _, _, ok := ClassifyPull("Failed", `Failed to pull image "registry.example/notfound/x509:429": rpc error: code = DeadlineExceeded desc = context deadline exceeded`)
	if !ok || cat != eventpipev1.CategoryTimeout {
		t.Fatalf("got %q %v, want timeout", cat, ok)
	}
}

// The three cause strings quoted in the stale-lifecycle seed.
func TestClassifyPullStaleLifecycleSeed(t *testing.T) {
	tests := []struct{ msg, want string }{
		{`reading manifest latest in docker.io/library/<name>: requested access to the resource is denied`, eventpipev1.CategoryNotFoundOrUnauthorized},
		{`pinging container registry localhost: ... connection refused`, eventpipev1.CategoryRegistryUnreachable},
		{`toomanyrequests: You have reached your unauthenticated pull rate limit`, eventpipev1.CategoryRateLimited},
	}
	for _, tt := range tests {
		for _, wrap := range []string{"%s", `Failed to pull image "x:latest": rpc error: code = Unknown desc = %s`} {
			msg := strings.Replace(wrap, "%s", tt.msg, 1)
			cat, _, _, ok := ClassifyPull("ErrImagePull", msg)
			if !ok || cat != tt.want {
				t.Errorf("ClassifyPull(%q) = %q %v, want %q", msg, cat, ok, tt.want)
			}
		}
	}
}

func TestNormalizeImage(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"nginx", "docker.io/library/nginx:latest"},
		{"nginx:1.25", "docker.io/library/nginx:1.25"},
		{"library/nginx", "docker.io/library/nginx:latest"},
		{"bitnami/redis:7", "docker.io/bitnami/redis:7"},
		{"docker.io/nginx", "docker.io/library/nginx:latest"},
		{"index.docker.io/jaegertracing/all-in-one@sha256:8d0bff43db3ce5c528cb6f957520511d263d7cceee012696e4afdc9087919bb9",
			"docker.io/jaegertracing/all-in-one@sha256:8d0bff43db3ce5c528cb6f957520511d263d7cceee012696e4afdc9087919bb9"},
		{"nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			"docker.io/library/nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"nginx:1.25@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			"docker.io/library/nginx:1.25@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"localhost/app", "localhost/app:latest"},
		{"localhost:5000/app", "localhost:5000/app:latest"},
		{"kind-registry:5000/test-operator/catalog:v4.10s", "kind-registry:5000/test-operator/catalog:v4.10s"},
		{"ghcr.io/nvidia/openshell/supervisor:0.0.0", "ghcr.io/nvidia/openshell/supervisor:0.0.0"},
		{"registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"},
		{"quay.io/app:Tag_With.Upper-1", "quay.io/app:Tag_With.Upper-1"},
		// Not references: left as written.
		{"None:None", "None:None"},
		{"registry.internal.renku.ch/GaRaLi/renku-challenge:e75f5d6", "registry.internal.renku.ch/GaRaLi/renku-challenge:e75f5d6"},
		{"${REPOSITORY_PREFIX}/vets-service:latest", "${REPOSITORY_PREFIX}/vets-service:latest"},
		{"https://harbor.k8s.mybank/release/name:1.1.0", "https://harbor.k8s.mybank/release/name:1.1.0"},
		{"/cloudfoundry/x:1", "/cloudfoundry/x:1"},
		{"registry.example/app:", "registry.example/app:"},
		{"gcr.io/a/b:gcr.io/a/b:1", "gcr.io/a/b:gcr.io/a/b:1"},
		{"app@sha256", "app@sha256"},
		{"a b", "a b"},
		// The distribution reference grammar, case by case.
		{"team/app__x:1", "docker.io/team/app__x:1"},
		{"team/my--app.v2:1", "docker.io/team/my--app.v2:1"},
		{"[::1]:5000/app:1", "[::1]:5000/app:1"},
		{"Registry.Example.com/team/app", "Registry.Example.com/team/app:latest"},
		{"example.com", "docker.io/library/example.com:latest"}, // no slash: a Docker Hub name
		{"localhost:5000", "docker.io/library/localhost:5000"},  // likewise, tag 5000
		{"quay.io/a/b:v1@sha512:" + strings.Repeat("ab", 64), "quay.io/a/b:v1@sha512:" + strings.Repeat("ab", 64)},
		{":1.0", ":1.0"}, // no name part
		{"@sha256:" + strings.Repeat("0", 64), "@sha256:" + strings.Repeat("0", 64)},
		{strings.Repeat("0a", 32), strings.Repeat("0a", 32)}, // an image id, not a name
		{"-nginx", "-nginx"},
		{"nginx-:1", "nginx-:1"},
		{"team/app..v2:1", "team/app..v2:1"},
		{"team/app___x:1", "team/app___x:1"},
		{"team//app", "team//app"},
		{"team/app/", "team/app/"},
		{"my_registry.example.com/app:1", "my_registry.example.com/app:1"},
		{"-registry.example.com/app", "-registry.example.com/app"},
		{"registry..example.com/app", "registry..example.com/app"},
		{"registry.example.com:port/app", "registry.example.com:port/app"},
		{"registry.example.com:/app", "registry.example.com:/app"},
		{"[zz]:5000/app", "[zz]:5000/app"},
		{"nginx:.bad", "nginx:.bad"},
		{"nginx:-bad", "nginx:-bad"},
		{"nginx:" + strings.Repeat("t", 129), "nginx:" + strings.Repeat("t", 129)},
		{"nginx:" + strings.Repeat("t", 128), "docker.io/library/nginx:" + strings.Repeat("t", 128)},
		{"nginx:a+b", "nginx:a+b"},
		{"nginx@sha256:0123", "nginx@sha256:0123"},
		{"nginx@sha256:" + strings.Repeat("A", 64), "nginx@sha256:" + strings.Repeat("A", 64)},
		{"nginx@md5:" + strings.Repeat("0", 32), "nginx@md5:" + strings.Repeat("0", 32)},
		{"team/" + strings.Repeat("a", 251), "team/" + strings.Repeat("a", 251)}, // path over 255
		{"ghcr.io/org/" + strings.Repeat("a", 251), "ghcr.io/org/" + strings.Repeat("a", 251) + ":latest"},
		{strings.Repeat("a", 247), "docker.io/library/" + strings.Repeat("a", 247) + ":latest"}, // 255 with library/
		{strings.Repeat("a", 248), strings.Repeat("a", 248)},                                    // 256 with library/
		// Normalising twice changes nothing.
		{"docker.io/library/" + strings.Repeat("a", 247) + ":latest", "docker.io/library/" + strings.Repeat("a", 247) + ":latest"},
	} {
		if got := NormalizeImage(tt.in); got != tt.want {
			t.Errorf("NormalizeImage(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	// Already normalised: the same string back, no allocation.
	ref := "ghcr.io/nvidia/openshell/supervisor:0.0.0"
	if n := testing.AllocsPerRun(100, func() { _ = NormalizeImage(ref) }); n != 0 {
		t.Errorf("NormalizeImage of a normalised reference allocates %v times", n)
	}
}

func TestImageFromCause(t *testing.T) {
	for _, tt := range []struct{ msg, want string }{
		{`Failed to inspect image "": rpc error: code = Unknown desc = short name mode is enforcing, but image name alpine:latest returns ambiguous list`, "alpine:latest"},
		{`Failed to inspect image "": rpc error: code = Unknown desc = short-name "kong:3.9" did not resolve to an alias`, "kong:3.9"},
		{`initializing source docker://quay.io/crio/redis:alpine: unexpected http code: 500`, "quay.io/crio/redis:alpine"},
		{`Error reading manifest latest-armh in docker.io/haugene/transmission-openvpn: manifest unknown`, "docker.io/haugene/transmission-openvpn:latest-armh"},
		{`reading manifest sha256:0123 in quay.io/a/b: manifest unknown`, "quay.io/a/b@sha256:0123"},
		{`with ErrImagePull: "Tag v1 not found in repository docker.io/a/b"`, "docker.io/a/b:v1"},
		{`Error response from daemon: manifest for quay.io/a/b:latest not found: manifest unknown`, "quay.io/a/b:latest"},
		{`image pull failed for quay.io/a/b:1, this may be because`, "quay.io/a/b:1"},
		{`Error: image library/toto:latest not found`, "library/toto:latest"},
		{`Error: ImagePullBackOff`, ""},
		{`Failed to pull image "": image pull failed for unknown error`, ""},
		{`image name "x" returns`, ""},
	} {
		if got := imageFromCause(tt.msg); got != tt.want {
			t.Errorf("imageFromCause(%q) = %q, want %q", tt.msg, got, tt.want)
		}
	}
}

// Old Docker messages: the registry's answer after "details: (" wins over
// the guess before it.
func TestClassifyPullDetailsWin(t *testing.T) {
	msg := `image pull failed for quay.io/a/b:1, this may be because there are no credentials on this request.  details: (Tag 1 not found in repository quay.io/a/b)`
	cat, img, _, ok := ClassifyPull("Failed", msg)
	if !ok || cat != eventpipev1.CategoryNotFound || img != "quay.io/a/b:1" {
		t.Fatalf("got %q %q %v, want not_found quay.io/a/b:1", cat, img, ok)
	}
	// Details that name no cause leave the preamble's.
	cat, _, _, _ = ClassifyPull("Failed", `image pull failed for quay.io/a/b:1, this may be because there are no credentials on this request.  details: (x)`)
	if cat != eventpipev1.CategoryUnauthorized {
		t.Fatalf("got %q, want unauthorized", cat)
	}
}

// A FailedCreatePodSandBox event names the pod sandbox ("pause") image: the
// occurrence says so (image role pod_sandbox), with the normalised image
// and the network cause.
func TestEnrichPodSandboxImage(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := podEvent("img-missing", "", "FailedCreatePodSandBox",
		`Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox image "rancher/mirrored-pause:3.6": failed to pull image "rancher/mirrored-pause:3.6": failed to pull and unpack image "docker.io/rancher/mirrored-pause:3.6": failed to resolve reference "docker.io/rancher/mirrored-pause:3.6": failed to do request: Head "https://registry-1.docker.io/v2/rancher/mirrored-pause/manifests/3.6": dial tcp 103.252.115.53:443: connect: connection refused`)
	ev.Type = "Warning"
	o := e.Enrich(ev, t0).Occurrence
	if o.ImageRole != eventpipev1.ImageRolePodSandbox || o.Image != "rancher/mirrored-pause:3.6" {
		t.Errorf("image %q role %q, want rancher/mirrored-pause:3.6 pod_sandbox", o.Image, o.ImageRole)
	}
	pf := o.PullFailure
	if pf == nil || pf.Category != eventpipev1.CategoryRegistryUnreachable || pf.Image != "docker.io/rancher/mirrored-pause:3.6" {
		t.Fatalf("pull failure %+v, want registry_unreachable docker.io/rancher/mirrored-pause:3.6", pf)
	}
	// A container's own pull keeps its role.
	ev = podEvent("img-missing", "spec.containers{agent}", "Failed", `Failed to pull image "nginx": pull QPS exceeded`)
	o = e.Enrich(ev, t0).Occurrence
	if o.ImageRole == eventpipev1.ImageRolePodSandbox || o.PullFailure == nil || o.PullFailure.Category != eventpipev1.CategoryKubeletThrottled {
		t.Errorf("container pull: role %q pull %+v", o.ImageRole, o.PullFailure)
	}
}

// A pull failure whose message names no image takes the pod spec's image,
// normalised like one the message names, on both paths (Event and pod
// status).
func TestPullFailureImageFromSpecNormalised(t *testing.T) {
	w := seedWorld()
	pod := seedPod()
	pod.Name, pod.UID = "short-image", "short-image-uid"
	pod.Containers = []Container{{Name: "agent", Image: "busybox", WaitingReason: "ErrImagePull", WaitingMessage: "Error: ErrImagePull"}}
	w.addPod(pod)
	e := mustNew(t, NewDefaultConfig(), w.lookups())
	o := e.Enrich(podEvent("short-image", "spec.containers{agent}", "Failed", "Error: ErrImagePull"), t0).Occurrence
	if o.PullFailure == nil || o.PullFailure.Image != "docker.io/library/busybox:latest" {
		t.Errorf("event: pull failure %+v, want image docker.io/library/busybox:latest", o.PullFailure)
	}
	occ := e.DiagnosePod(pod, t0)
	if len(occ) != 1 || occ[0].PullFailure == nil || occ[0].PullFailure.Image != "docker.io/library/busybox:latest" {
		t.Errorf("pod status: %+v, want one pull failure of docker.io/library/busybox:latest", occ)
	}
}

// The fourth draw's rules: containerd 2.x refusing a schema 1 image, and
// GHCR's bare "denied" (private or absent, it does not say which), which
// must not capture the worded "denied: ..." answers other rules decide.
func TestClassifyPullSchema1AndBareDenied(t *testing.T) {
	tests := []struct{ reason, msg, want string }{
		{"Failed", `Failed to pull image "registry.k8s.io/guestbook:v3": failed to pull and unpack image "registry.k8s.io/guestbook:v3": failed to get converter for "registry.k8s.io/guestbook:v3": Pulling Schema 1 images have been deprecated and disabled by default since containerd v2.0.`,
			eventpipev1.CategoryUnsupportedFormat},
		{"Failed", `Failed to pull image "ghcr.io/o/i:1": Error response from daemon: Head "https://ghcr.io/v2/o/i/manifests/1": denied`,
			eventpipev1.CategoryNotFoundOrUnauthorized},
		{"Failed", "Failed to pull image \"ghcr.io/o/i:1\": rpc error: code = Unknown desc = Error response from daemon: Head https://ghcr.io/v2/o/i/manifests/1: denied\n",
			eventpipev1.CategoryNotFoundOrUnauthorized},
		{"Failed", `Failed to pull image "gcr.io/p/i:1": rpc error: code = Unknown desc = Error response from daemon: Head https://gcr.io/v2/p/i/manifests/1: denied: Permission denied for "1" from request "/v2/p/i/manifests/1".`,
			eventpipev1.CategoryUnauthorized},
		{"Failed", `Failed to pull image "a/b:1": rpc error: code = Unknown desc = Error response from daemon: pull access denied for a/b, repository does not exist or may require 'docker login': denied: requested access to the resource is denied`,
			eventpipev1.CategoryNotFoundOrUnauthorized},
		{"Failed", `Failed to pull image "redis": Could not reach any registry endpoint`, eventpipev1.CategoryRegistryUnreachable},
	}
	for _, tt := range tests {
		if got, _, _, ok := ClassifyPull(tt.reason, tt.msg); !ok || got != tt.want {
			t.Errorf("%q: got %s (ok=%v), want %s", tt.msg, got, ok, tt.want)
		}
	}
}

// The families the fifth draw's training part added (bench/diagnosis/draws.md,
// "Fifth draw"), in wordings other than the corpus messages': each rule
// must hold for its family, not for one string.
func TestClassifyPullFifthDrawFamilies(t *testing.T) {
	tests := []struct {
		name, reason, msg, want, wantImage string
	}{
		{"kubelet before 1.0 wrote its reasons in lower case", "failed",
			`Failed to pull image "quay.io/o/api:0.1.0"`, eventpipev1.CategoryUnknown, "quay.io/o/api:0.1.0"},
		{"the daemon's own 500 gives way to the registry's answer", "Failed",
			`Failed to pull image "r.example.com:5000/app": API error (500): Get https://r.example.com:5000/v2/app/manifests/latest: unauthorized: authentication required`,
			eventpipev1.CategoryUnauthorized, "r.example.com:5000/app:latest"},
		{"the daemon's own 500 with a manifest not found", "Failed",
			`Failed to pull image "r.example.com/app:1": API error (500): manifest for r.example.com/app:1 not found`,
			eventpipev1.CategoryNotFound, "r.example.com/app:1"},
		// It was registry_unreachable until issue 24: the daemon's 500
		// wraps any failure, so alone it is a weak fragment.
		{"the daemon's own 500 alone is unrecognised, not a guess", "Failed",
			`Failed to pull image "r.example.com/app:1": API error (500): `, eventpipev1.CategoryUnrecognised, "r.example.com/app:1"},
		{"aggregate: an attempt that got a not found beats a refused credential", "",
			`Failed to pull image "r.example.com/app": [rpc error: code = Unknown desc = Error response from daemon: Get https://r.example.com/v2/app/manifests/latest: unauthorized: authentication required, rpc error: code = Unknown desc = Error response from daemon: manifest for r.example.com/app:latest not found: manifest unknown: manifest unknown]`,
			eventpipev1.CategoryNotFound, "r.example.com/app:latest"},
		{"aggregate: a refused credential beats a server error", "",
			`Failed to pull image "r.example.com/app:2": [rpc error: code = Unknown desc = Error response from daemon: Get https://r.example.com/v2/app/manifests/2: received unexpected HTTP status: 502 Bad Gateway, rpc error: code = Unknown desc = Error response from daemon: Get https://r.example.com/v2/app/manifests/2: denied: access forbidden]`,
			eventpipev1.CategoryUnauthorized, "r.example.com/app:2"},
		{"aggregate: attempts of one rank keep the rule order", "",
			`Failed to pull image "r.example.com/app:2": [rpc error: code = Unknown desc = dial tcp 10.0.0.1:443: i/o timeout, rpc error: code = Unknown desc = context deadline exceeded]`,
			eventpipev1.CategoryRegistryUnreachable, "r.example.com/app:2"},
		{"containerd's content store lost an ingest", "Failed",
			`Failed to pull image "docker.io/library/redis:7": rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/library/redis:7": failed to copy: failed reading status of resume write: stat /var/lib/containerd/io.containerd.content.v1.content/ingest/0a1b/data: no such file or directory: not found`,
			eventpipev1.CategoryRuntimeStore, "docker.io/library/redis:7"},
		{"a 404 whose body is a CDN page", "Failed",
			`Failed to pull image "registry.example.com/ns/op:v1": rpc error: code = Unknown desc = Error reading manifest v1 in registry.example.com/ns/op: error parsing HTTP 404 response body: invalid character '<' looking for beginning of value: "<html></html>"`,
			eventpipev1.CategoryNotFound, "registry.example.com/ns/op:v1"},
		{"a closing quote lost: the reference ends at the first \": \"", "Failed",
			`Failed to pull image "r.example.com/team/app:3f2a: rpc error: code = Unknown desc = Get https://r.example.com/v2/: dial tcp: lookup r.example.com: no such host`,
			eventpipev1.CategoryRegistryUnreachable, "r.example.com/team/app:3f2a"},
		{"a message cut inside the reference names none", "Failed",
			`Failed to pull image "r.example.com/team/ap`, eventpipev1.CategoryUnknown, ""},
	}
	for _, tt := range tests {
		cat, img, _, ok := ClassifyPull(tt.reason, tt.msg)
		if !ok || cat != tt.want || img != tt.wantImage {
			t.Errorf("%s: got %s %q (ok=%v), want %s %q", tt.name, cat, img, ok, tt.want, tt.wantImage)
		}
	}
	// A lower-case reason is a candidate, not a pull failure by itself.
	if cat, _, _, ok := ClassifyPull("failed", `Failed to start container "app": exec format error`); ok {
		t.Errorf("lower-case failed without a pull marker classified as %s", cat)
	}
}

// The families the seventh draw's training part added, in wordings other
// than the corpus messages'.
func TestClassifyPullSeventhDrawFamilies(t *testing.T) {
	tests := []struct {
		name, reason, msg, want, wantImage string
	}{
		{"Docker's registry ping kept without the kubelet's prefix", "",
			`Error response from daemon: Get https://registry.example.com/v2/: dial tcp 10.0.0.9:443: connect: connection refused`,
			eventpipev1.CategoryRegistryUnreachable, ""},
		{"a signed CDN URL's Signature= is not an image signature", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = failed to pull and unpack image "r.example.com/app:1": failed to copy: httpReadSeeker: failed open: failed to do request: Get "https://cdn.example.net/blobs/ab?Expires=1&Signature=AbC~d&Key-Pair-Id=K": EOF`,
			eventpipev1.CategoryRegistryUnreachable, "r.example.com/app:1"},
		{"a signature the policy asked for still decides beside a signed URL", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = Error reading signatures: Get "https://sigstore.example.net/app?X-Amz-Signature=0f": dial tcp 10.0.0.9:443: i/o timeout`,
			eventpipev1.CategoryPolicyRejected, "r.example.com/app:1"},
		{"a registry that withdrew a version", "Failed",
			`Failed to pull image "r.example.com/vendor/db:13.2": rpc error: code = Unknown desc = failed to pull and unpack image "r.example.com/vendor/db:13.2": failed to resolve reference "r.example.com/vendor/db:13.2": unknown: this image version is no longer available`,
			eventpipev1.CategoryNotFound, "r.example.com/vendor/db:13.2"},
	}
	for _, tt := range tests {
		cat, img, _, ok := ClassifyPull(tt.reason, tt.msg)
		if !ok || cat != tt.want || img != tt.wantImage {
			t.Errorf("%s: got %s %q (ok=%v), want %s %q", tt.name, cat, img, ok, tt.want, tt.wantImage)
		}
	}
	// A registry pod's own probe names the same URL, not a pull.
	if cat, _, _, ok := ClassifyPull("", `Readiness probe failed: Get https://10.0.0.9:5000/v2/: dial tcp 10.0.0.9:5000: connect: connection refused`); ok {
		t.Errorf("a registry's readiness probe classified as %s", cat)
	}
}

// Wordings of old runtimes the rules lacked until issue 24 (the held-out
// misses P0210, P0408, P0310, P0785, P0235, P0890 carry them), and the
// neighbours each new rule must leave alone.
func TestClassifyPullOldRuntimeWordings(t *testing.T) {
	for _, tt := range []struct {
		name, reason, msg string
		ok                bool
		want, image       string
	}{
		{"cri-o without registries", "", `Failed to inspect image "nginx:alpine": rpc error: code = Unknown desc = no registries configured while trying to pull an unqualified image`,
			true, eventpipev1.CategoryPolicyRejected, "docker.io/library/nginx:alpine"},
		{"containerd 1.3 scope-less challenge", "Failed", `Failed to pull image "r.example/a/b": rpc error: code = Unknown desc = failed to pull and unpack image "r.example/a/b:latest": failed to resolve reference "r.example/a/b:latest": no scope specified for token auth challenge`,
			true, eventpipev1.CategoryUnauthorized, "r.example/a/b:latest"},
		{"docker 1.12 manifest list", "Failed", `Failed to pull image "traefik": rpc error: code = 2 desc = no supported platform found in manifest list`,
			true, eventpipev1.CategoryPlatformMismatch, "docker.io/library/traefik:latest"},
		{"docker v1 not found, no reason", "", `Error: image openshift/foo:latest not found`,
			true, eventpipev1.CategoryNotFound, "docker.io/openshift/foo:latest"},
		{"docker v1 not found, old lower-case reason", "failed", `Error: image openshift/foo not found`,
			true, eventpipev1.CategoryNotFound, "docker.io/openshift/foo:latest"},
		// Only the whole message is Docker's v1 answer; other "Error: image"
		// sentences are not pull failures.
		{"other error about an image", "", `Error: image openshift/foo:latest is in use by a running container`, false, "", ""},
		{"not found in a longer message", "", `Error: image gc failed: image openshift/foo not found in store, retrying`, false, "", ""},
		{"not a candidate reason", "Unhealthy", `Error: image openshift/foo not found`, false, "", ""},
		{"docker socket pull call deadline", "Failed", `Failed to pull image "tccr.io/a/b:1": rpc error: code = Unknown desc = Post "http://%2Fvar%2Frun%2Fdocker.sock/v1.41/images/create?fromImage=tccr.io%2Fa%2Fb&tag=1": context deadline exceeded`,
			true, eventpipev1.CategoryTimeout, "tccr.io/a/b:1"},
		// The same call refused at the socket: the runtime, not the time.
		{"docker socket refused", "Failed", `Failed to pull image "tccr.io/a/b:1": rpc error: code = Unknown desc = Post "http://%2Fvar%2Frun%2Fdocker.sock/v1.41/images/create?fromImage=tccr.io%2Fa%2Fb&tag=1": dial unix /var/run/docker.sock: connect: connection refused`,
			true, eventpipev1.CategoryRuntimeStore, "tccr.io/a/b:1"},
		// A registry request's deadline stays registry_unreachable.
		{"registry request deadline", "Failed", `Failed to pull image "tccr.io/a/b:1": rpc error: code = Unknown desc = Error response from daemon: Get "https://tccr.io/v2/": context deadline exceeded`,
			true, eventpipev1.CategoryRegistryUnreachable, "tccr.io/a/b:1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cat, img, _, ok := ClassifyPull(tt.reason, tt.msg)
			if ok != tt.ok || cat != tt.want || img != tt.image {
				t.Fatalf("ClassifyPull = %q %q %v, want %q %q %v", cat, img, ok, tt.want, tt.image, tt.ok)
			}
		})
	}
}

// TestPullConfidence: every answer says how sure it is. A rule specific to
// one cause is certain; words other causes share, or a precedence the rules
// resolve with less than certainty, are likely; rules that disagree, or a
// weak fragment alone, are unrecognised (weak) with the runtime's words;
// a message with no cause is unknown (weak) with no words.
func TestPullConfidence(t *testing.T) {
	tests := []struct {
		name, reason, msg    string
		category, confidence string
		detail               string // "" = not checked; "-" = must be empty
	}{
		{"one specific rule", "Failed",
			`Failed to pull image "docker.io/library/busybox:0.0.0-does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`,
			eventpipev1.CategoryNotFound, eventpipev1.ConfidenceCertain, "docker.io/library/busybox:0.0.0-does-not-exist: not found"},
		{"a documented precedence: containerd's platform filter wraps a not-found kind", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = NotFound desc = failed to pull and unpack image "r.example.com/app:1": no match for platform in manifest: not found`,
			eventpipev1.CategoryPlatformMismatch, eventpipev1.ConfidenceCertain, ""},
		{"a bare 401 from a token endpoint is likely, not certain", "Failed",
			`Failed to pull image "gcr.io/p/app:1": rpc error: code = Unknown desc = failed to pull and unpack image "gcr.io/p/app:1": failed to resolve reference "gcr.io/p/app:1": pulling from host gcr.io failed with status code [manifests 1]: 401 Unauthorized`,
			eventpipev1.CategoryUnauthorized, eventpipev1.ConfidenceLikely, ""},
		{"the two-sided refusal is likely: its words name both sides", "Failed",
			`Failed to pull image "acme/private:1.0": rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/acme/private:1.0": failed to resolve reference "docker.io/acme/private:1.0": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed`,
			eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.ConfidenceLikely, ""},
		{"Docker's two-sided refusal, likely too", "Failed",
			`Failed to pull image "acme/private:1.0": rpc error: code = Unknown desc = Error response from daemon: pull access denied for acme/private, repository does not exist or may require 'docker login': denied: requested access to the resource is denied`,
			eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.ConfidenceLikely, ""},
		{"no basic auth credentials inside it stays certain", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = failed to pull and unpack image "r.example.com/app:1": failed to resolve reference "r.example.com/app:1": pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials`,
			eventpipev1.CategoryUnauthorized, eventpipev1.ConfidenceCertain, ""},
		{"a refused password is certain", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = Error response from daemon: Get https://r.example.com/v2/app/manifests/1: unauthorized: incorrect username or password`,
			eventpipev1.CategoryUnauthorized, eventpipev1.ConfidenceCertain, ""},
		{"a 429 whose text says unauthorized too: a likely precedence", "Failed",
			`Failed to pull image "nginx:1.25": rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/library/nginx:1.25": failed to copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/library/nginx/manifests/sha256:ab: 429 Too Many Requests - Server message: toomanyrequests: You have reached your unauthenticated pull rate limit`,
			eventpipev1.CategoryRateLimited, eventpipev1.ConfidenceLikely, ""},
		{"rules that disagree: a 401 that also says not found", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = failed to pull and unpack image "r.example.com/app:1": failed to resolve reference "r.example.com/app:1": unexpected status from HEAD request to https://r.example.com/v2/app/manifests/1: 401 Unauthorized: repository r.example.com/app not found`,
			eventpipev1.CategoryUnrecognised, eventpipev1.ConfidenceWeak, "unexpected status from HEAD request to https://r.example.com/v2/app/manifests/1: 401 Unauthorized: repository r.example.com/app not found"},
		{"a weak fragment alone: containerd's request wrapper", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = failed to pull and unpack image "r.example.com/app:1": failed to resolve reference "r.example.com/app:1": failed to do request: Head "https://r.example.com/v2/app/manifests/1"`,
			eventpipev1.CategoryUnrecognised, eventpipev1.ConfidenceWeak, ""},
		{"the weak fragment yields to a rule that names the cause", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = failed to pull and unpack image "r.example.com/app:1": failed to resolve reference "r.example.com/app:1": failed to do request: Head "https://r.example.com/v2/app/manifests/1": dial tcp: lookup r.example.com: no such host`,
			eventpipev1.CategoryRegistryUnreachable, eventpipev1.ConfidenceCertain, ""},
		{"words no rule reads", "Failed",
			`Failed to pull image "r.example.com/app:1": rpc error: code = Unknown desc = the flux capacitor is misaligned`,
			eventpipev1.CategoryUnrecognised, eventpipev1.ConfidenceWeak, "the flux capacitor is misaligned"},
		{"a bare back-off names no cause", "BackOff", `Back-off pulling image "r.example.com/app:1"`,
			eventpipev1.CategoryUnknown, eventpipev1.ConfidenceWeak, "-"},
		{"the kubelet's prefix cut before the cause", "Failed", `Failed to pull image "r.example.com/app:1"`,
			eventpipev1.CategoryUnknown, eventpipev1.ConfidenceWeak, "-"},
		{"the pre-1.5 wrapper around a back-off", "FailedSync",
			`Error syncing pod, skipping: failed to "StartContainer" for "web" with ImagePullBackOff: "Back-off pulling image \"nginx\""`,
			eventpipev1.CategoryUnknown, eventpipev1.ConfidenceWeak, "-"},
		{"the kubelet's own reason decides when no rule does", "InvalidImageName", `Failed to apply default image tag "Nginx"`,
			eventpipev1.CategoryInvalidReference, eventpipev1.ConfidenceCertain, ""},
		{"an aggregate's attempts are no disagreement", "",
			`Failed to pull image "r.example.com/app": [rpc error: code = Unknown desc = Error response from daemon: Get https://r.example.com/v2/: x509: certificate signed by unknown authority, rpc error: code = Unknown desc = Error response from daemon: Get https://r.example.com/v2/: dial tcp 10.0.0.9:443: i/o timeout]`,
			eventpipev1.CategoryRegistryUnreachable, eventpipev1.ConfidenceLikely, ""},
	}
	for _, tt := range tests {
		v, ok := PullVerdict(tt.reason, tt.msg)
		if !ok || v.Category != tt.category || v.Confidence != tt.confidence {
			t.Errorf("%s: got %s %s (ok=%v), want %s %s", tt.name, v.Category, v.Confidence, ok, tt.category, tt.confidence)
		}
		switch tt.detail {
		case "":
		case "-":
			if v.Detail != "" {
				t.Errorf("%s: detail %q, want none", tt.name, v.Detail)
			}
		default:
			if v.Detail != tt.detail {
				t.Errorf("%s: detail %q, want %q", tt.name, v.Detail, tt.detail)
			}
		}
		if v.Category == eventpipev1.CategoryUnrecognised && v.Detail == "" {
			t.Errorf("%s: unrecognised without the runtime's words", tt.name)
		}
	}
}

package enrich

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// pullMessage is one entry of testdata/pull_messages.json: a real kubelet /
// runtime pull-failure message from a public source.
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

var allCategories = []string{
	eventpipev1.CategoryNotFound, eventpipev1.CategoryUnauthorized, eventpipev1.CategoryNotFoundOrUnauthorized,
	eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryTLSError, eventpipev1.CategoryRateLimited,
	eventpipev1.CategoryInvalidReference, eventpipev1.CategoryNeverPull, eventpipev1.CategoryPlatformMismatch,
	eventpipev1.CategoryNodeStorage, eventpipev1.CategoryPolicyRejected, eventpipev1.CategoryTimeout,
	eventpipev1.CategoryUnknown,
}

func TestClassifyPullRealMessages(t *testing.T) {
	msgs := loadJSON[pullMessage](t, "testdata/pull_messages.json")
	if len(msgs) < 60 {
		t.Fatalf("want at least 60 real messages, have %d", len(msgs))
	}
	cats := map[string]int{}
	runtimes := map[string]int{}
	for i, m := range msgs {
		if m.Source == "" || m.Runtime == "" {
			t.Errorf("entry %d: source and runtime are required", i)
		}
		cats[m.Category]++
		runtimes[m.Runtime]++
		cat, img, detail, ok := ClassifyPull(m.Reason, m.Message)
		if !ok {
			t.Errorf("entry %d (%s): not recognised as a pull failure: %q", i, m.Source, m.Message)
			continue
		}
		if cat != m.Category {
			t.Errorf("entry %d (%s): category %q, want %q\n  message: %q", i, m.Source, cat, m.Category, m.Message)
		}
		if cat != eventpipev1.CategoryUnknown && detail == "" {
			t.Errorf("entry %d: empty detail for category %s", i, cat)
		}
		if strings.Contains(m.Message, `image "`) && img == "" {
			t.Errorf("entry %d: image not extracted from %q", i, m.Message)
		}
	}
	for _, c := range allCategories {
		if cats[c] == 0 {
			t.Errorf("no real message for category %s", c)
		}
	}
	for _, r := range []string{"containerd", "cri-o", "docker"} {
		if runtimes[r] == 0 {
			t.Errorf("no real message from runtime %s", r)
		}
	}
}

func TestClassifyPullNegative(t *testing.T) {
	type neg struct {
		Reason, Message, Source string
	}
	for i, m := range loadJSON[neg](t, "testdata/not_pull_messages.json") {
		if cat, _, _, ok := ClassifyPull(m.Reason, m.Message); ok {
			t.Errorf("entry %d (%s): classified as pull failure %q: %q", i, m.Source, cat, m.Message)
		}
	}
}

func TestClassifyPullImageAndDetail(t *testing.T) {
	tests := []struct {
		reason, msg, image, detail string
	}{
		{"Failed", `Failed to pull image "docker.io/library/busybox:0.0.0-does-not-exist": rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/busybox:0.0.0-does-not-exist": failed to resolve reference "docker.io/library/busybox:0.0.0-does-not-exist": docker.io/library/busybox:0.0.0-does-not-exist: not found`,
			"docker.io/library/busybox:0.0.0-does-not-exist", "docker.io/library/busybox:0.0.0-does-not-exist: not found"},
		{"InvalidImageName", `Failed to apply default image tag "None:None": couldn't parse image reference "None:None": invalid reference format: repository name must be lowercase`,
			"None:None", "invalid reference format: repository name must be lowercase"},
		{"ErrImageNeverPull", `Container image "nginx:latest" is not present with pull policy of Never`, "nginx:latest", `Container image "nginx:latest" is not present with pull policy of Never`},
		{"BackOff", `Back-off pulling image "selenium/hub"`, "selenium/hub", ""},
		{"FailedSync", `Error syncing pod, skipping: failed to "StartContainer" for "nginx" with ImagePullBackOff: "Back-off pulling image \"nginx\""`, "nginx", ""},
		{"Failed", `Failed to pull image "x/y:1": rpc error: code = Unknown desc = Error response from daemon: toomanyrequests: You have reached your pull rate limit.`, "x/y:1", "toomanyrequests: You have reached your pull rate limit."},
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

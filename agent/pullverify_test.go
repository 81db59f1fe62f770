package agent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify"
	"github.com/eventpipe/eventpipe/enrich/verify/registrytest"
)

// TestPullFailureVerifiedByRegistry: kubelet's "pull access denied,
// repository does not exist or may require authorization" cannot tell a
// missing tag from missing credentials (not_found_or_unauthorized, by text
// rule). With verify.pull_failures on, the agent ships the failure at once
// as the text rule decided it, asks the registry beside the event path,
// and ships an update of the same diagnosis: not_found, decided by the
// registry, certain, naming the tags that exist. The next failure of the
// image is upgraded in place from the cached answer, with no second call.
func TestPullFailureVerifiedByRegistry(t *testing.T) {
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	reg := registrytest.New(t)
	reg.Push(t, "acme/app:1.0", registrytest.ImageFor(t, "linux", "amd64"))
	reg.Push(t, "acme/app:1.1", registrytest.ImageFor(t, "linux", "amd64"))
	image := reg.Host + "/acme/app:9.9.9"

	ns := "verify-pull"
	admin := testNamespace(t, ns)
	pod := createPod(t, admin, ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: image}}}})

	col := startCollector(t, t.TempDir())
	cfg := testConfig("verifypull", col.addr())
	cfg.Verify.Enabled, cfg.Verify.PullFailures = true, true
	ra := startAgent(t, cfg)
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) { return ra.a.synced.Load(), "" })

	failed := func(n int) {
		kubeletEvent(t, admin, pod, fmt.Sprintf("app.%d", n), "Failed", "spec.containers{agent}", accessDenied(image))
	}
	pulls := func() []*eventpipev1.Occurrence {
		var out []*eventpipev1.Occurrence
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && o.GetPullFailure() != nil {
				out = append(out, o)
			}
		}
		return out
	}
	failed(1)
	var got []*eventpipev1.Occurrence
	waitFor(t, 60*time.Second, "the failure and its registry update at the collector", func() (bool, string) {
		got = pulls()
		return len(got) == 2, fmt.Sprintf("%d pull failures", len(got))
	})
	text, upd := got[0].GetPullFailure(), got[1].GetPullFailure()
	// The pod names no pull secret: before the registry answers, the
	// cluster context says the pull went out anonymous.
	if text.GetCategory() != eventpipev1.CategoryUnauthorized || text.GetDecidedBy() != eventpipev1.DecidedByClusterContext {
		t.Errorf("first: %s decided by %s; want cluster context's unauthorized", text.GetCategory(), text.GetDecidedBy())
	}
	if got[1].GetEventId() != VerifiedEventIDPrefix+got[0].GetEventId() || upd.GetCategory() != eventpipev1.CategoryNotFound ||
		upd.GetDecidedBy() != eventpipev1.DecidedByRegistry || upd.GetConfidence() != eventpipev1.ConfidenceCertain ||
		upd.GetDisposition() != eventpipev1.DispositionPersistent || got[1].GetInvolvedObject().GetName() != "app" {
		t.Errorf("update %s: %v", got[1].GetEventId(), upd)
	}
	if want := "tag 9.9.9 does not exist in " + reg.Host + "/acme/app; newest tags by version (of 2): 1.1, 1.0"; upd.GetDetail() != want {
		t.Errorf("detail %q, want %q", upd.GetDetail(), want)
	}
	calls := reg.Calls.Load()

	failed(2)
	waitFor(t, 60*time.Second, "the second failure at the collector", func() (bool, string) {
		got = pulls()
		return len(got) == 3, fmt.Sprintf("%d pull failures", len(got))
	})
	if pf := got[2].GetPullFailure(); pf.GetCategory() != eventpipev1.CategoryNotFound || pf.GetDecidedBy() != eventpipev1.DecidedByRegistry {
		t.Errorf("second failure not upgraded from the cache: %v", pf)
	}
	if reg.Calls.Load() != calls {
		t.Errorf("the cached answer made %d more registry calls", reg.Calls.Load()-calls)
	}
	if n := counter(t, ra.reg, "eventpipe_agent_verify_applied_total", map[string]string{"how": "cached"}); n != 1 {
		t.Errorf("applied{how=cached} = %v, want 1", n)
	}
	if n := counter(t, ra.reg, "eventpipe_verify_registry_calls_total", map[string]string{"answer": "tag_not_found"}); n != 1 {
		t.Errorf("registry calls{tag_not_found} = %v, want 1", n)
	}
}

// TestVerifiedAnswerKeptPastExpiry: once the cached registry answer has
// expired, a new failure of the image is shown with the last verified
// answer (marked as being asked again), not the text rule's cause, until
// the new answer replaces it. Before the fix the failure went out with the
// text cause and the update followed: a flash of the wrong answer.
func TestVerifiedAnswerKeptPastExpiry(t *testing.T) {
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	reg := registrytest.New(t)
	reg.Push(t, "acme/app:1.0", registrytest.ImageFor(t, "linux", "amd64"))
	image := reg.Host + "/acme/app:9.9.9"
	now := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	cfg := verify.NewDefaultConfig()
	cfg.InsecureRegistries = []string{reg.Host}
	v, err := verify.New(cfg, verify.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan *eventpipev1.Occurrence, 4)
	pv := newPullVerifier(v, VerifyConfig{Queue: 4}, testLogger(t), m, out)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- pv.run(ctx) }()
	defer func() { cancel(); <-stopped }()

	failure := func(id string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{EventId: id, PullFailure: &eventpipev1.PullFailure{Image: image,
			Category: eventpipev1.CategoryNotFoundOrUnauthorized, DecidedBy: eventpipev1.DecidedByTextRule, Confidence: eventpipev1.ConfidenceLikely}}
	}
	update := func() *eventpipev1.PullFailure {
		t.Helper()
		select {
		case o := <-out:
			return o.GetPullFailure()
		case <-time.After(2 * time.Minute):
			t.Fatal("no update from the registry check")
			return nil
		}
	}
	pv.annotate(failure("1"))
	if pf := update(); pf.GetCategory() != eventpipev1.CategoryNotFound || pf.GetDecidedBy() != eventpipev1.DecidedByRegistry {
		t.Fatalf("first check: %v", pf)
	}

	now = now.Add(cfg.CacheTTL + time.Second) // the answer has expired
	o := failure("2")
	pv.annotate(o)
	pf := o.GetPullFailure()
	if pf.GetCategory() != eventpipev1.CategoryNotFound || pf.GetDecidedBy() != eventpipev1.DecidedByRegistry ||
		!strings.Contains(pf.GetDetail(), "; the registry's answer of 2026-12-05T03:00:00Z, being asked again") {
		t.Errorf("after expiry the failure shows %s decided by %s (%q); want the last verified not_found", pf.GetCategory(), pf.GetDecidedBy(), pf.GetDetail())
	}
	if pf := update(); pf.GetCategory() != eventpipev1.CategoryNotFound || pf.GetDecidedBy() != eventpipev1.DecidedByRegistry ||
		strings.Contains(pf.GetDetail(), "being asked again") {
		t.Errorf("the new answer: %v", pf)
	}
	if n := counterValue(t, m.verifyApplied.WithLabelValues("kept")); n != 1 {
		t.Errorf("applied{how=kept} = %v, want 1", n)
	}
}

package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

const missingSecretMsg = "Unable to retrieve some image pull secrets (regcred); attempting to pull the image may not succeed."

func TestPullContextMissingSecret(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	pod := func(name string) *eventpipev1.ObjectRef {
		return &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: name}
	}
	warn := &eventpipev1.Occurrence{Reason: reasonMissingPullSecret, Message: missingSecretMsg, InvolvedObject: pod("a")}
	fail := func(name, cat, by string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{Reason: "Failed", InvolvedObject: pod(name),
			PullFailure: &eventpipev1.PullFailure{Category: cat, DecidedBy: by, Detail: "pull access denied"}}
	}
	cases := []struct {
		name string
		o    *eventpipev1.Occurrence
		at   time.Duration
		want string // category after; "" unchanged
	}{
		{"ambiguous words, same pod", fail("a", eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.DecidedByTextRule), time.Minute, eventpipev1.CategoryUnauthorized},
		{"no cause in the words", fail("a", eventpipev1.CategoryUnknown, eventpipev1.DecidedByTextRule), time.Minute, eventpipev1.CategoryUnauthorized},
		{"another pod", fail("b", eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.DecidedByTextRule), time.Minute, ""},
		{"a cause the words decide", fail("a", eventpipev1.CategoryNodeStorage, eventpipev1.DecidedByTextRule), time.Minute, ""},
		{"decided by the registry", fail("a", eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.DecidedByRegistry), time.Minute, ""},
		{"warning too old", fail("a", eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.DecidedByTextRule), pullContextTTL + time.Second, ""},
	}
	for _, c := range cases {
		pc := newPullContext(nil)
		pc.apply(warn, t0)
		before := c.o.GetPullFailure().GetCategory()
		changed := pc.apply(c.o, t0.Add(c.at))
		pf := c.o.GetPullFailure()
		switch {
		case c.want == "" && (changed || pf.GetCategory() != before):
			t.Errorf("%s: changed to %s", c.name, pf.GetCategory())
		case c.want != "" && (!changed || pf.GetCategory() != c.want || pf.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
			pf.GetConfidence() != eventpipev1.ConfidenceLikely || !strings.Contains(pf.GetDetail(), "pull secret(s) regcred (FailedToRetrieveImagePullSecret)")):
			t.Errorf("%s: changed %v to %+v", c.name, changed, pf)
		}
	}
}

// TestMissingPullSecretOnRealAPIServer: the kubelet's
// FailedToRetrieveImagePullSecret for a pod, then its pull failure in words
// that cannot tell a missing image from missing credentials, through the
// real kube-apiserver and the agent: the failure arrives as unauthorized,
// decided by cluster context, naming the secret. Then the image is pulled
// by that pod, and another pod's failure in the same words is unauthorized
// too (rule "pulled elsewhere"), naming who pulled it.
func TestMissingPullSecretOnRealAPIServer(t *testing.T) {
	ctx := context.Background()
	ns := "pull-context"
	admin := testNamespace(t, ns)
	image := "registry.example/acme/private:1.0"
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
			Containers: []corev1.Container{{Name: "agent", Image: image}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = admin.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("pullcontext", col.addr()))
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) { return ra.a.synced.Load(), "" })

	event := func(name, reason, field, msg string) { kubeletEvent(t, admin, pod, name, reason, field, msg) }
	event("app.secret", reasonMissingPullSecret, "", missingSecretMsg)
	// Let the warning reach the agent first: the watch gives no order
	// across a pod's Events, and the rule applies to failures after it.
	waitFor(t, 60*time.Second, "the warning at the collector", func() (bool, string) {
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && o.GetReason() == reasonMissingPullSecret {
				return true, ""
			}
		}
		return false, "not yet"
	})
	event("app.failed", "Failed", "spec.containers{agent}", accessDenied(image))
	var pf *eventpipev1.PullFailure
	waitFor(t, 60*time.Second, "the pull failure at the collector", func() (bool, string) {
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && o.GetPullFailure() != nil {
				pf = o.GetPullFailure()
				return true, ""
			}
		}
		return false, "not yet"
	})
	if pf.GetCategory() != eventpipev1.CategoryUnauthorized || pf.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
		!strings.Contains(pf.GetDetail(), "image pull secret(s) regcred") {
		t.Errorf("pull failure %v", pf)
	}
	if n := counter(t, ra.reg, "eventpipe_agent_context_applied_total", nil); n != 1 {
		t.Errorf("context applied %v, want 1", n)
	}

	// Rule "pulled elsewhere": pod app pulls the image after all (its
	// secret came), then pod app-2, with no secret, fails in the same
	// ambiguous words: the image exists, so it is credentials.
	event("app.pulled", "Pulled", "spec.containers{agent}", `Successfully pulled image "`+image+`" in 1.2s (1.2s including waiting). Image size: 1000 bytes.`)
	waitFor(t, 60*time.Second, "the Pulled at the collector", func() (bool, string) {
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && o.GetReason() == "Pulled" {
				return true, ""
			}
		}
		return false, "not yet"
	})
	pod2, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app-2"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: image}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = admin.CoreV1().Pods(ns).Delete(ctx, pod2.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	pod = pod2
	event("app-2.failed", "Failed", "spec.containers{agent}", accessDenied(image))
	waitFor(t, 60*time.Second, "app-2's failure at the collector", func() (bool, string) {
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && o.GetInvolvedObject().GetName() == "app-2" && o.GetPullFailure() != nil {
				pf = o.GetPullFailure()
				return true, ""
			}
		}
		return false, "not yet"
	})
	if pf.GetCategory() != eventpipev1.CategoryUnauthorized || pf.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
		!strings.Contains(pf.GetDetail(), "pod "+ns+"/app on node node-1 pulled the same image") {
		t.Errorf("app-2's pull failure %v", pf)
	}
}

func TestPullContextPulledElsewhere(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	img := "docker.io/acme/private:1.0"
	pulled := func(pod, msg, image string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{Reason: "Pulled", Message: msg, Image: image, ReportingInstance: "node-2",
			InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: pod}}
	}
	ok := `Successfully pulled image "acme/private:1.0" in 1.2s (1.2s including waiting). Image size: 1000 bytes.`
	fail := func(pod, cat string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{Reason: "Failed", InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: pod},
			PullFailure: &eventpipev1.PullFailure{Category: cat, Image: img, Detail: "pull access denied"}}
	}
	cases := []struct {
		name   string
		before *eventpipev1.Occurrence
		o      *eventpipev1.Occurrence
		at     time.Duration
		want   bool
	}{
		{"another pod pulled it (short name, same image)", pulled("other", ok, "acme/private:1.0"), fail("app", eventpipev1.CategoryNotFoundOrUnauthorized), time.Minute, true},
		{"the same pod pulled it", pulled("app", ok, img), fail("app", eventpipev1.CategoryNotFoundOrUnauthorized), time.Minute, false},
		{"already present proves nothing", pulled("other", `Container image "acme/private:1.0" already present on machine`, img), fail("app", eventpipev1.CategoryNotFoundOrUnauthorized), time.Minute, false},
		{"another tag", pulled("other", ok, "docker.io/acme/private:2.0"), fail("app", eventpipev1.CategoryNotFoundOrUnauthorized), time.Minute, false},
		{"words that decide", pulled("other", ok, img), fail("app", eventpipev1.CategoryNotFound), time.Minute, false},
		{"pulled too long ago", pulled("other", ok, img), fail("app", eventpipev1.CategoryNotFoundOrUnauthorized), pulledTTL + time.Second, false},
	}
	for _, c := range cases {
		pc := newPullContext(nil)
		pc.apply(c.before, t0)
		changed := pc.apply(c.o, t0.Add(c.at))
		pf := c.o.GetPullFailure()
		if changed != c.want || (c.want && (pf.GetCategory() != eventpipev1.CategoryUnauthorized || pf.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
			!strings.Contains(pf.GetDetail(), "pod ns/other on node node-2 pulled the same image at 2026-12-04T12:00:00Z, so it exists"))) {
			t.Errorf("%s: changed %v, %+v", c.name, changed, pf)
		}
	}
}

// kubeletEvent writes a Warning Event about pod as the kubelet on node-1
// does (core/v1, source kubelet, count 1).
func kubeletEvent(t *testing.T, admin kubernetes.Interface, pod *corev1.Pod, name, reason, field, msg string) {
	t.Helper()
	now := metav1.Now()
	if _, err := admin.CoreV1().Events(pod.Namespace).Create(context.Background(), &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, APIVersion: "v1", FieldPath: field},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// accessDenied is containerd's failure for an image the registry will not
// name to this caller: missing, or private (Docker Hub's words).
func accessDenied(image string) string {
	return `Failed to pull image "` + image + `": rpc error: code = Unknown desc = failed to pull and unpack image "` + image +
		`": failed to resolve reference "` + image + `": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed`
}

func TestPullContextSecretsSent(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	secrets := map[string][]string{"ns/none": nil, "ns/sends": {"regcred", "mirror"}, "ns/missing": {"regcred"}}
	lookup := func(ns, name string) ([]string, bool) {
		s, ok := secrets[ns+"/"+name]
		return s, ok
	}
	fail := func(pod, cat, by string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{Reason: "Failed", InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: pod},
			PullFailure: &eventpipev1.PullFailure{Category: cat, DecidedBy: by, Confidence: eventpipev1.ConfidenceLikely, Detail: "pull access denied"}}
	}
	const ambiguous, text = eventpipev1.CategoryNotFoundOrUnauthorized, eventpipev1.DecidedByTextRule
	cases := []struct {
		name string
		o    *eventpipev1.Occurrence
		want string // category after; "" unchanged
		says string // in the detail
	}{
		{"no pull secret: anonymous", fail("none", ambiguous, text), eventpipev1.CategoryUnauthorized, "names no imagePullSecrets"},
		{"pull secrets sent", fail("sends", ambiguous, text), eventpipev1.CategoryNotFound, "sent the pod's image pull secret(s) regcred, mirror"},
		{"a secret the kubelet could not read", fail("missing", ambiguous, text), eventpipev1.CategoryUnauthorized, "could not retrieve the pod's image pull secret(s) regcred"},
		{"pod not cached", fail("gone", ambiguous, text), "", ""},
		{"unrecognised stays", fail("none", eventpipev1.CategoryUnrecognised, text), "", ""},
		{"unknown stays", fail("sends", eventpipev1.CategoryUnknown, text), "", ""},
		{"words that decide", fail("sends", eventpipev1.CategoryUnauthorized, text), "", ""},
		{"decided by the registry", fail("none", ambiguous, eventpipev1.DecidedByRegistry), "", ""},
	}
	for _, c := range cases {
		pc := newPullContext(lookup)
		pc.apply(&eventpipev1.Occurrence{Reason: reasonMissingPullSecret, Message: missingSecretMsg,
			InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: "missing"}}, t0)
		before := proto.Clone(c.o.GetPullFailure()).(*eventpipev1.PullFailure)
		changed := pc.apply(c.o, t0.Add(time.Minute))
		pf := c.o.GetPullFailure()
		switch {
		case c.want == "" && (changed || !proto.Equal(pf, before)):
			t.Errorf("%s: changed to %v", c.name, pf)
		case c.want != "" && (!changed || pf.GetCategory() != c.want || pf.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
			pf.GetConfidence() != eventpipev1.ConfidenceLikely || !strings.Contains(pf.GetDetail(), c.says) || !strings.HasPrefix(pf.GetDetail(), "pull access denied; ")):
			t.Errorf("%s: changed %v to %v", c.name, changed, pf)
		}
	}
}

func TestPullContextNodes(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	img := "registry.example/acme/app:1.0"
	fail := func(node, cat string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{Reason: "Failed", ReportingInstance: node, InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: "on-" + node},
			PullFailure: &eventpipev1.PullFailure{Category: cat, Image: img, DecidedBy: eventpipev1.DecidedByTextRule, Confidence: eventpipev1.ConfidenceCertain, Detail: "dial tcp: lookup registry.example: no such host"}}
	}
	pulled := func(node string) *eventpipev1.Occurrence {
		return &eventpipev1.Occurrence{Reason: "Pulled", Image: img, ReportingInstance: node, InvolvedObject: &eventpipev1.ObjectRef{Kind: "Pod", Namespace: "ns", Name: "on-" + node},
			Message: `Successfully pulled image "` + img + `" in 1.2s (1.2s including waiting). Image size: 1000 bytes.`}
	}
	type step struct {
		o  *eventpipev1.Occurrence
		at time.Duration
	}
	const dns, timeout = eventpipev1.CategoryRegistryUnreachable, eventpipev1.CategoryTimeout
	cases := []struct {
		name  string
		steps []step // the last one is judged
		says  string // in its detail; "" unchanged
	}{
		{"one node, nothing else known", []step{{fail("node-1", dns), 0}}, ""},
		{"two nodes fail the same way", []step{{fail("node-1", dns), 0}, {fail("node-2", dns), time.Minute}},
			"fails the same way on 2 nodes (node-1, node-2) and no node pulled it: the cause is the registry's"},
		{"the same node twice", []step{{fail("node-1", dns), 0}, {fail("node-1", dns), time.Minute}}, ""},
		{"another node pulled it", []step{{pulled("node-2"), 0}, {fail("node-1", dns), time.Minute}},
			"node node-2 pulled the same image at 2026-12-04T12:00:00Z, so the registry serves it: the cause is local to node node-1"},
		{"pulled on the failing node itself", []step{{pulled("node-1"), 0}, {fail("node-1", dns), time.Minute}}, ""},
		{"pulled elsewhere too long ago", []step{{pulled("node-2"), 0}, {fail("node-1", dns), pulledTTL + time.Second}}, ""},
		{"another cause on the other node", []step{{fail("node-1", timeout), 0}, {fail("node-2", dns), time.Minute}}, ""},
		{"the other node's failure too old", []step{{fail("node-1", dns), 0}, {fail("node-2", dns), pullContextTTL + time.Second}}, ""},
		{"not on the way to the registry", []step{{fail("node-1", eventpipev1.CategoryNotFound), 0}, {fail("node-2", eventpipev1.CategoryNotFound), time.Minute}}, ""},
		{"unrecognised stays", []step{{fail("node-1", eventpipev1.CategoryUnrecognised), 0}, {fail("node-2", eventpipev1.CategoryUnrecognised), time.Minute}}, ""},
		{"no node named", []step{{fail("node-1", dns), 0}, {fail("", dns), time.Minute}}, ""},
	}
	for _, c := range cases {
		pc := newPullContext(nil)
		var changed bool
		for _, s := range c.steps {
			changed = pc.apply(s.o, t0.Add(s.at))
		}
		last := c.steps[len(c.steps)-1].o.GetPullFailure()
		switch {
		case c.says == "" && (changed || last.GetDecidedBy() != eventpipev1.DecidedByTextRule):
			t.Errorf("%s: changed to %v", c.name, last)
		case c.says != "" && (!changed || last.GetCategory() != dns || last.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
			last.GetConfidence() != eventpipev1.ConfidenceLikely || !strings.Contains(last.GetDetail(), c.says)):
			t.Errorf("%s: changed %v to %v", c.name, changed, last)
		}
	}
}

// testNamespace creates namespace ns on the test cluster and returns an
// admin client.
func testNamespace(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	admin, err := kubernetes.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return admin
}

// createPod creates pod in ns and deletes it (no grace) when the test ends.
func createPod(t *testing.T, admin kubernetes.Interface, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = admin.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	return p
}

// grantAgent binds the agent's service account to a Role name of rules in ns.
func grantAgent(t *testing.T, admin kubernetes.Interface, ns, name string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "eventpipe-agent", Namespace: kube.AgentNamespace}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

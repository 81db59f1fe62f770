package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/kube"
)

// TestPullSecretsSentOnRealAPIServer: two pods fail in words that cannot
// tell a missing repository from missing credentials; the agent reads each
// pod's spec.imagePullSecrets names from its pod cache (no Secret, no
// ServiceAccount): the pod that names none failed anonymous (unauthorized),
// the pod that sent its secret failed with a login the registry took
// (not_found), both likely, decided by cluster context.
func TestPullSecretsSentOnRealAPIServer(t *testing.T) {
	ns := "pull-secrets-sent"
	admin := testNamespace(t, ns)
	image := "registry.example/acme/private:1.0"
	pods := map[string]*corev1.Pod{}
	for name, secrets := range map[string][]corev1.LocalObjectReference{"anon": nil, "sends": {{Name: "regcred"}, {Name: "mirror"}}} {
		pods[name] = createPod(t, admin, ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{ImagePullSecrets: secrets, Containers: []corev1.Container{{Name: "agent", Image: image}}}})
	}
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("pullsecrets", col.addr()))
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) { return ra.a.synced.Load(), "" })
	for name, p := range pods {
		kubeletEvent(t, admin, p, name+".failed", "Failed", "spec.containers{agent}", accessDenied(image))
	}
	got := map[string]*eventpipev1.PullFailure{}
	waitFor(t, 60*time.Second, "both failures at the collector", func() (bool, string) {
		for _, o := range col.all(t) {
			if o.GetNamespace() == ns && o.GetPullFailure() != nil {
				got[o.GetInvolvedObject().GetName()] = o.GetPullFailure()
			}
		}
		return len(got) == 2, fmt.Sprintf("%d of 2", len(got))
	})
	for name, want := range map[string]struct{ category, says string }{
		"anon":  {eventpipev1.CategoryUnauthorized, "the pod names no imagePullSecrets"},
		"sends": {eventpipev1.CategoryNotFound, "sent the pod's image pull secret(s) regcred, mirror"},
	} {
		pf := got[name]
		if pf.GetCategory() != want.category || pf.GetDecidedBy() != eventpipev1.DecidedByClusterContext ||
			pf.GetConfidence() != eventpipev1.ConfidenceLikely || !strings.Contains(pf.GetDetail(), want.says) {
			t.Errorf("%s: %v; want %s, cluster_context, likely, saying %q", name, pf, want.category, want.says)
		}
	}
	if n := counter(t, ra.reg, "eventpipe_agent_context_applied_total", nil); n != 2 {
		t.Errorf("context applied %v, want 2", n)
	}
}

// TestPullNodesOnHollowNodes: real kubelets on two hollow nodes pull
// through their CRI. Image "local" resolves on node pn-b and not on pn-a
// (a node's own DNS): pn-b pulls it, so pn-a's failure is local to pn-a.
// Image "down" fails to resolve on both: registry-side. Both stay
// registry_unreachable (the words decide the category), decided by cluster
// context, likely, the detail naming the nodes.
func TestPullNodesOnHollowNodes(t *testing.T) {
	ctx := context.Background()
	local, down := "registry.example/acme/local:1.0", "down.example/acme/app:1.0"
	nodeRules := map[string][]kube.ImageRule{
		"pn-a": {{Image: local, Pull: kube.PullDNS}, {Image: down, Pull: kube.PullDNS}},
		"pn-b": {{Image: local, Pull: kube.PullOK}, {Image: down, Pull: kube.PullDNS}},
	}
	for _, name := range []string{"pn-a", "pn-b"} {
		nctx, cancel := context.WithTimeout(ctx, 15*time.Minute) // a cold build of the kubelet included
		n, err := cluster.AddNode(nctx, kube.NodeConfig{Name: name, CPU: "2", Memory: "4Gi", Pods: 10, Runtime: kube.RuntimeConfig{Images: nodeRules[name]}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.StopNode(n) })
	}
	ns := "pull-nodes"
	admin := testNamespace(t, ns)
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("pullnodes", col.addr()))
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) { return ra.a.synced.Load(), "" })
	run := func(name, node, image string) {
		t.Helper()
		createPod(t, admin, ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: image}}}})
	}
	// until waits for an occurrence of pod that satisfies ok.
	until := func(what, pod string, ok func(*eventpipev1.Occurrence) bool) *eventpipev1.Occurrence {
		t.Helper()
		var found *eventpipev1.Occurrence
		waitFor(t, 4*time.Minute, what, func() (bool, string) {
			var seen []string
			for _, o := range col.all(t) {
				if o.GetNamespace() != ns || o.GetInvolvedObject().GetName() != pod {
					continue
				}
				if ok(o) {
					found = o
					return true, ""
				}
				seen = append(seen, o.GetReason()+" "+o.GetPullFailure().GetCategory()+" "+o.GetPullFailure().GetDetail())
			}
			return false, strings.Join(seen, "\n")
		})
		return found
	}
	contextDecided := func(says string) func(*eventpipev1.Occurrence) bool {
		return func(o *eventpipev1.Occurrence) bool {
			return o.GetPullFailure().GetDecidedBy() == eventpipev1.DecidedByClusterContext && strings.Contains(o.GetPullFailure().GetDetail(), says)
		}
	}

	run("local-b", "pn-b", local)
	until("pn-b's Pulled of "+local, "local-b", func(o *eventpipev1.Occurrence) bool {
		return o.GetReason() == "Pulled" && o.GetReportingInstance() == "pn-b"
	})
	run("local-a", "pn-a", local)
	o := until("pn-a's failure decided node-local", "local-a", contextDecided("node pn-b pulled the same image"))
	if pf := o.GetPullFailure(); pf.GetCategory() != eventpipev1.CategoryRegistryUnreachable || pf.GetConfidence() != eventpipev1.ConfidenceLikely ||
		!strings.Contains(pf.GetDetail(), "the cause is local to node pn-a") {
		t.Errorf("local-a: %v", pf)
	}

	run("down-a", "pn-a", down)
	run("down-b", "pn-b", down)
	for _, pod := range []string{"down-a", "down-b"} {
		o := until(pod+"'s failure decided registry-side", pod, contextDecided("fails the same way on 2 nodes (pn-a, pn-b)"))
		if pf := o.GetPullFailure(); pf.GetCategory() != eventpipev1.CategoryRegistryUnreachable || pf.GetConfidence() != eventpipev1.ConfidenceLikely {
			t.Errorf("%s: %v", pod, pf)
		}
	}
	for _, o := range col.all(t) {
		if pf := o.GetPullFailure(); o.GetNamespace() == ns && pf.GetDecidedBy() == eventpipev1.DecidedByClusterContext &&
			o.GetInvolvedObject().GetName() == "down-a" && strings.Contains(pf.GetDetail(), "local to") {
			t.Errorf("down-a called node-local: %v", pf)
		}
	}
}

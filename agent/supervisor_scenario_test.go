package agent

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich/verify/registrytest"
)

// TestSupervisorImageCheckBeforeAnySandbox: an OpenShell gateway
// StatefulSet on the real kube-apiserver whose supervisor image tag does not
// exist in the (in-process) registry, and no sandbox at all. The agent,
// with verify.supervisor on and only the Role the chart renders for it,
// reads the gateway's setting, asks the registry, and before any sandbox
// exists ships a SupervisorImageUnavailable occurrence (not_found, decided
// by the registry, naming the tags that do exist) and raises
// eventpipe_agent_supervisor_image_bad. When the operator fixes the tag,
// the change is seen within verify.supervisor.interval: a
// SupervisorImageVerified occurrence, and the gauge drops to 0. The
// change is seen through the watch on that one StatefulSet: the polling
// interval is ten minutes, the wait one.
func TestSupervisorImageCheckBeforeAnySandbox(t *testing.T) {
	t.Run("watched", func(t *testing.T) {
		supervisorScenario(t, "openshell-supcheck", []string{"get", "list", "watch"}, 10*time.Minute)
	})
	// An older chart's Role grants get only: the watch is refused and the
	// check reads the workload every interval instead.
	t.Run("watch refused", func(t *testing.T) {
		supervisorScenario(t, "openshell-supcheck-get", []string{"get"}, 300*time.Millisecond)
	})
}

func supervisorScenario(t *testing.T, ns string, verbs []string, interval time.Duration) {
	ctx := context.Background()
	// The registry: go-containerregistry's in-process one (behind token
	// auth, asked anonymously), holding the supervisor at 0.0.36 only.
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	reg := registrytest.New(t)
	reg.Push(t, "nvidia/openshell/supervisor:0.0.36", registrytest.ImageFor(t, "linux", "amd64"))
	repo := reg.Host + "/nvidia/openshell/supervisor"

	admin := testNamespace(t, ns)
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	// What the chart grants with agent.verify.supervisor set
	// (templates/agent-rbac.yaml): get, list and watch of that one workload
	// and its config, by name.
	grantAgent(t, admin, ns, "eventpipe-agent-supervisor-check", []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"statefulsets", "deployments"}, ResourceNames: []string{"openshell"}, Verbs: verbs},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"openshell-config"}, Verbs: verbs},
	})
	// The gateway, as OpenShell's chart renders it with
	// supervisor.image.tag overridden the old way (env).
	labels := map[string]string{"app.kubernetes.io/name": "openshell"}
	bad := repo + ":0.0.0-does-not-exist"
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "openshell", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, ServiceName: "openshell",
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "openshell-gateway", Image: "ghcr.io/nvidia/openshell/gateway:0.0.36",
				Args: []string{"--config", "/etc/openshell/gateway.toml"},
				Env:  []corev1.EnvVar{{Name: "OPENSHELL_SUPERVISOR_IMAGE", Value: bad}},
			}}}}}}
	sts, err := admin.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	col := startCollector(t, t.TempDir())
	cfg := testConfig("supcheck", col.addr())
	cfg.Verify.Enabled = true
	cfg.Verify.Supervisor = SupervisorCheckConfig{Namespace: ns, Name: "openshell", Container: "openshell-gateway",
		GatewayID: "gw-supcheck", Interval: interval}
	ra := startAgent(t, cfg)

	checks := func() []*eventpipev1.Occurrence {
		var out []*eventpipev1.Occurrence
		for _, o := range col.all(t) {
			if eventpipev1.IsSupervisorCheck(o) && o.GetNamespace() == ns {
				out = append(out, o)
			}
		}
		return out
	}
	var first *eventpipev1.Occurrence
	waitFor(t, 90*time.Second, "a SupervisorImageUnavailable occurrence at the collector", func() (bool, string) {
		cs := checks()
		if len(cs) == 0 {
			return false, "none yet"
		}
		first = cs[0]
		return true, ""
	})
	pf := first.GetPullFailure()
	if first.GetReason() != eventpipev1.ReasonSupervisorImageUnavailable || pf.GetCategory() != eventpipev1.CategoryNotFound ||
		pf.GetDecidedBy() != eventpipev1.DecidedByRegistry || pf.GetConfidence() != eventpipev1.ConfidenceCertain {
		t.Fatalf("first check: reason %s category %s decided by %q (%s), %s", first.GetReason(), pf.GetCategory(), pf.GetDecidedBy(), pf.GetConfidence(), first.GetMessage())
	}
	for _, want := range []string{"tag 0.0.0-does-not-exist does not exist in " + repo, "newest tags by version (of 1): 0.0.36"} {
		if !strings.Contains(pf.GetDetail(), want) {
			t.Errorf("detail %q lacks %q", pf.GetDetail(), want)
		}
	}
	if first.GetImage() != bad || first.GetImageRole() != eventpipev1.ImageRoleSupervisor || first.GetSandbox().GetGatewayId() != "gw-supcheck" ||
		first.GetInvolvedObject().GetKind() != "StatefulSet" || first.GetInvolvedObject().GetUid() != string(sts.UID) {
		t.Errorf("occurrence names image %q role %q gateway %q object %v", first.GetImage(), first.GetImageRole(), first.GetSandbox().GetGatewayId(), first.GetInvolvedObject())
	}
	if !strings.Contains(first.GetMessage(), "env OPENSHELL_SUPERVISOR_IMAGE") {
		t.Errorf("message %q does not say where the image is set", first.GetMessage())
	}
	if g := counter(t, ra.reg, "eventpipe_agent_supervisor_image_bad", nil); g != 1 {
		t.Errorf("eventpipe_agent_supervisor_image_bad = %v, want 1", g)
	}
	pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("the scenario has no sandbox: %d pods, %v", len(pods.Items), err)
	}
	// The same answer is not shipped again.
	time.Sleep(2 * time.Second)
	if n := len(checks()); n != 1 {
		t.Errorf("%d check occurrences for one unchanged answer", n)
	}
	// Nor sent: a resent answer would be dropped by the collector (same
	// event_id: the answer's check time), so count at the agent.
	if n := counter(t, ra.reg, "eventpipe_agent_occurrences_total", map[string]string{"source": sourceRegistryCheck}); n != 1 {
		t.Errorf("the agent shipped %v check occurrences for one unchanged answer", n)
	}

	// The operator fixes the tag: the change is read and verified.
	sts.Spec.Template.Spec.Containers[0].Env[0].Value = repo + ":0.0.36"
	if _, err := admin.AppsV1().StatefulSets(ns).Update(ctx, sts, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a SupervisorImageVerified occurrence after the fix", func() (bool, string) {
		cs := checks()
		last := cs[len(cs)-1]
		return last.GetReason() == eventpipev1.ReasonSupervisorImageVerified && last.GetPullFailure() == nil,
			fmt.Sprintf("%d checks, last %s", len(cs), last.GetReason())
	})
	if g := counter(t, ra.reg, "eventpipe_agent_supervisor_image_bad", nil); g != 0 {
		t.Errorf("eventpipe_agent_supervisor_image_bad = %v after the fix, want 0", g)
	}
	if n := counter(t, ra.reg, "eventpipe_agent_supervisor_resolve_errors_total", nil); n != 0 {
		t.Errorf("%v resolve errors (the Role should allow every read)", n)
	}
}

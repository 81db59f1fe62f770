package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// TestSandboxRefusalFromReadyCondition: the Agent Sandbox controller
// writes no Event when the API server refuses the pod, only the Sandbox's
// Ready condition. This package's control plane runs no controller, so the
// test writes the condition through the status subresource with the words
// the controller (v1.0.1) writes (testenv/cmd/demo's TestMakeRunWriters
// reads them from the real controller). The agent reads it from its
// Sandbox cache and ships a create_refused blocker about the CR to the
// real collector; a change that leaves the condition as it was ships
// nothing; the condition's clearing ships an occurrence without a blocker.
func TestSandboxRefusalFromReadyCondition(t *testing.T) {
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("conditions", col.addr()))
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) {
		return ra.a.Ready() == nil && ra.a.synced.Load(), fmt.Sprint(ra.a.Ready())
	})
	drv, err := osdriver.New(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, s, err := osdriver.Build("quota", osdriver.Params{Mode: scenario.ModeManaged, Workspace: "cond-quota"})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := drv.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	res := dyn.Resource(osdriver.SandboxGVR).Namespace(cr.GetNamespace())
	setReady := func(status, reason, msg string) {
		t.Helper()
		cur, err := res.Get(ctx, cr.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cond := map[string]any{"type": "Ready", "status": status, "reason": reason, "message": msg,
			"lastTransitionTime": time.Now().UTC().Format(time.RFC3339), "observedGeneration": cur.GetGeneration()}
		if err := unstructured.SetNestedSlice(cur.Object, []any{cond}, "status", "conditions"); err != nil {
			t.Fatal(err)
		}
		if _, err := res.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	conditions := func() []*eventpipev1.Occurrence {
		var out []*eventpipev1.Occurrence
		for _, o := range col.all(t) {
			if eventpipev1.IsSandboxCondition(o) && o.GetSandbox().GetId() == s.ID {
				out = append(out, o)
			}
		}
		return out
	}

	setReady("False", "DependenciesNotReady", "Pod does not exist")
	const refusal = `Error seen: pods "quota" is forbidden: exceeded quota: sandbox-pods, requested: pods=1, used: pods=0, limited: pods=0`
	setReady("False", "ReconcilerError", refusal)
	var got []*eventpipev1.Occurrence
	waitFor(t, 60*time.Second, "the refusal at the collector", func() (bool, string) {
		got = conditions()
		return len(got) == 1, fmt.Sprint(got)
	})
	o := got[0]
	b := o.GetBlocker()
	if b.GetKind() != eventpipev1.BlockerKindCreateRefused || b.GetCause() != eventpipev1.BlockerQuotaExceeded ||
		b.GetObject() != "ResourceQuota/sandbox-pods" || b.GetSource() != eventpipev1.PullSourceSandboxCondition || b.GetFix() == "" {
		t.Errorf("blocker %v, want create_refused/quota_exceeded on ResourceQuota/sandbox-pods from the sandbox condition, with a fix", b)
	}
	if !strings.HasPrefix(b.GetDetail(), `pods "quota" is forbidden: exceeded quota`) {
		t.Errorf("detail %q", b.GetDetail())
	}
	if obj := o.GetInvolvedObject(); obj.GetKind() != "Sandbox" || obj.GetName() != cr.GetName() || obj.GetUid() != string(cr.GetUID()) ||
		o.GetReason() != "ReconcilerError" || o.GetMessage() != refusal || o.GetType() != "Warning" {
		t.Errorf("occurrence %s %s %q about %v", o.GetType(), o.GetReason(), o.GetMessage(), obj)
	}

	// Another change of the CR, the condition as it was: nothing to say.
	patch := []byte(`{"metadata":{"annotations":{"eventpipe.test/touched":"yes"}}}`)
	if _, err := res.Patch(ctx, cr.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller's pod went through: the refusal is over.
	setReady("False", "DependenciesNotReady", "Pod exists with phase: Pending")
	waitFor(t, 60*time.Second, "the clearing at the collector", func() (bool, string) {
		got = conditions()
		return len(got) >= 2, fmt.Sprint(got)
	})
	time.Sleep(2 * time.Second) // anything else the agent ships arrives too
	if got = conditions(); len(got) != 2 {
		t.Fatalf("%d condition occurrences, want the refusal and its end: %v", len(got), got)
	}
	if o := got[1]; o.GetBlocker() != nil || o.GetReason() != "DependenciesNotReady" || o.GetType() != "Normal" ||
		o.GetMessage() != "Pod exists with phase: Pending" {
		t.Errorf("clearing occurrence %s %s %q, blocker %v", o.GetType(), o.GetReason(), o.GetMessage(), o.GetBlocker())
	}
}

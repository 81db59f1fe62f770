package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// TestReplacedSandboxLateEventsKeepTheOldID is issue 25's replacement
// (seed 001, "stale events of an old sandbox must not mutate its
// replacement") on the real kube-apiserver: sandbox web fails to pull its
// image, is deleted (CR, pods, claim) and created again under the same
// name (a new id, a new CR and pod with the old ones' names) and starts;
// then the kubelet writes one more pull failure of the old pod (it names
// the old pod by uid). The agent must ship the deletion, attribute the
// late Event to the old id (marked deleted), never to the new one, and a
// reader of the collector must answer about the new id for the name.
//
// Before the fix the late Event was attributed to the new id (the pod
// cached under the name is the new one), and diagnose by name found two
// sandboxes named web.
func TestReplacedSandboxLateEventsKeepTheOldID(t *testing.T) {
	for _, mode := range []scenario.Mode{scenario.ModeManaged, scenario.ModeShared} {
		t.Run(string(mode), func(t *testing.T) { testReplacement(t, mode) })
	}
}

func testReplacement(t *testing.T, mode scenario.Mode) {
	dir := t.TempDir()
	col := startCollector(t, dir)
	ra := startAgent(t, testConfig("replacement", col.addr()))
	clients, err := scenario.NewClients(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) {
		return ra.a.Ready() == nil && ra.a.synced.Load(), fmt.Sprint(ra.a.Ready())
	})
	ctx := context.Background()
	ws := "repl-" + string(mode)[:3]
	p := scenario.Params{Mode: mode, Workspace: ws, Name: "web"}

	// The old sandbox: its workload image does not exist.
	oldSc, err := scenario.ImageNotFound(p)
	if err != nil {
		t.Fatal(err)
	}
	oldRes, err := scenario.Play(ctx, clients, oldSc)
	if err != nil {
		t.Fatal(err)
	}
	old := scenario.NewSandbox("web", ws, mode)
	old.ID = sandboxIDOf(oldRes)
	oldPodUID := oldRes.UIDs["Pod "+old.Namespace()+"/"+old.PodName()]
	if old.ID == "" || oldPodUID == "" {
		t.Fatalf("old sandbox id %q pod uid %q (uids %v)", old.ID, oldPodUID, oldRes.UIDs)
	}
	waitStored(t, col, oldRes)

	// Deleted, as OpenShell and the controllers do.
	del := scenario.NewBuilder("web-delete", "sandbox web deleted").
		Delete(old, scenario.TargetSandbox).Delete(old, scenario.TargetWorkloadPod).
		Delete(old, scenario.TargetSupervisorPod).Delete(old, scenario.TargetPVC)
	delSc, err := del.Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := scenario.Play(ctx, clients, delSc); err != nil {
		t.Fatal(err)
	}

	// Created again under its name, and healthy.
	newSc, err := scenario.Healthy(p)
	if err != nil {
		t.Fatal(err)
	}
	newRes, err := scenario.Play(ctx, clients, newSc)
	if err != nil {
		t.Fatal(err)
	}
	newID := sandboxIDOf(newRes)
	if newID == "" || newID == old.ID {
		t.Fatalf("new sandbox id %q (old %q)", newID, old.ID)
	}
	// The new pod is cached (its Events are attributed by its annotation)
	// before the late Event is written, so the name leads to it.
	waitStored(t, col, newRes)

	// The kubelet's late pull failure of the old pod.
	now := metav1.Now()
	late := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: old.Namespace(), Name: old.PodName() + ".late"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: old.Namespace(), Name: old.PodName(),
			UID: types.UID(oldPodUID), FieldPath: "spec.initContainers{workspace-init}"},
		Type: corev1.EventTypeWarning, Reason: "Failed",
		Message: `Failed to pull image "` + scenario.ImageMissing + `": ` + scenario.ErrNotFound(scenario.ImageMissing),
		Source:  corev1.EventSource{Component: "kubelet", Host: old.Node}, ReportingController: "kubelet", ReportingInstance: old.Node,
		FirstTimestamp: now, LastTimestamp: now, Count: 7,
	}
	created, err := clients.Kube.CoreV1().Events(old.Namespace()).Create(ctx, late, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var lateOcc, deletion *eventpipev1.Occurrence
	waitFor(t, 60*time.Second, "the late Event and the deletion at the collector", func() (bool, string) {
		for _, o := range col.all(t) {
			switch {
			case o.GetEvent().GetUid() == string(created.UID):
				lateOcc = o
			case eventpipev1.IsSandboxDeletion(o) && o.GetSandbox().GetId() == old.ID:
				deletion = o
			}
		}
		return lateOcc != nil && deletion != nil, fmt.Sprintf("late %v, deletion %v", lateOcc != nil, deletion != nil)
	})
	if got := lateOcc.GetSandbox().GetId(); got == newID {
		t.Fatalf("the old pod's late Event was attributed to the replacement %s (attribution %s)", newID, lateOcc.GetAttribution())
	}
	if got := lateOcc.GetSandbox().GetId(); got != old.ID || lateOcc.GetSandbox().GetDeletedAt() == nil {
		t.Errorf("late Event: sandbox %q deleted_at %v, want the old id %s marked deleted", got, lateOcc.GetSandbox().GetDeletedAt(), old.ID)
	}
	if lateOcc.GetPullFailure().GetCategory() != eventpipev1.CategoryNotFound {
		t.Errorf("late Event: pull failure %v", lateOcc.GetPullFailure())
	}
	if sb := deletion.GetSandbox(); sb.GetName() != "web" || sb.GetWorkspace() != ws {
		t.Errorf("deletion occurrence names %q in %q", sb.GetName(), sb.GetWorkspace())
	}
	// Nothing of the old id reached the new one.
	for _, o := range col.all(t) {
		if o.GetSandbox().GetId() == newID && (o.GetPullFailure() != nil || o.GetInvolvedObject().GetUid() == oldPodUID) {
			t.Errorf("the new id got %s %s (involved uid %s)", o.GetReason(), o.GetEventId(), o.GetInvolvedObject().GetUid())
		}
	}

	// What a reader of the collector answers for the name.
	conn, err := grpc.NewClient(col.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f, _, err := diagnosis.Read(rctx, eventpipev1.NewFollowClient(conn), &eventpipev1.FollowRequest{Workspace: ws, SandboxName: "web", Tail: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var live []diagnosis.Diagnosis
	for _, d := range f.Find("web", ws) {
		if d.Live() {
			live = append(live, d)
		} else if d.ID != old.ID || d.State != diagnosis.StateDeleted || d.ReplacedBy != newID {
			t.Errorf("old sandbox: id %s state %s replaced by %q", d.ID, d.State, d.ReplacedBy)
		}
	}
	if len(live) != 1 || live[0].ID != newID || live[0].Blocked() {
		t.Errorf("live sandboxes named web: %+v, want %s and clear", live, newID)
	}
}

// sandboxIDOf is the sandbox id a played scenario's Events expect.
func sandboxIDOf(res *scenario.Result) string {
	for _, e := range res.Events {
		if e.Expect.SandboxID != "" {
			return e.Expect.SandboxID
		}
	}
	return ""
}

// waitStored waits until every Event of res is at the collector with the
// sandbox id it expects.
func waitStored(t *testing.T, col *testCollector, res *scenario.Result) {
	t.Helper()
	waitFor(t, 60*time.Second, "the played Events at the collector, attributed", func() (bool, string) {
		got := map[string]string{}
		for _, o := range col.all(t) {
			got[o.GetEvent().GetUid()+"/"+o.GetEvent().GetResourceVersion()] = o.GetSandbox().GetId()
		}
		for _, e := range res.Events {
			id, ok := got[e.UID+"/"+e.ResourceVersion]
			if !ok || id != e.Expect.SandboxID {
				return false, fmt.Sprintf("%s %s: stored %v, sandbox %q want %q", e.Key, e.Reason, ok, id, e.Expect.SandboxID)
			}
		}
		return true, ""
	})
}

package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/testenv/scenario"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestBlockerScenariosReachCollector plays the blockers other than image
// pulls (a pod no node has room for, a workspace claim with no StorageClass
// in a cluster without a default one, a container that exits and is
// restarted with back-off) into the real kube-apiserver while one agent
// runs, and checks at the real collector that every Event the scenario
// marks as a blocker arrives with that blocker's kind and cause, attributed
// to its sandbox, with a fix; that the claim's repeated FailedBinding turns
// persistent while missing capacity stays retrying; and that the crashing
// container's pod status arrives as a pod_status blocker naming its last
// termination (Error).
func TestBlockerScenariosReachCollector(t *testing.T) {
	col := startCollector(t, t.TempDir())
	ra := startAgent(t, testConfig("blockers", col.addr()))
	clients, err := scenario.NewClients(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "agent to sync", func() (bool, string) {
		return ra.a.Ready() == nil && ra.a.synced.Load(), fmt.Sprint(ra.a.Ready())
	})

	type played struct {
		name string
		res  *scenario.Result
	}
	var all []played
	for _, name := range []string{"unschedulable", "pvc-unbound", "crash-loop"} {
		s, err := scenario.Build(name, scenario.Params{Mode: scenario.ModeManaged, Workspace: "blk-" + name})
		if err != nil {
			t.Fatal(err)
		}
		res, err := scenario.Play(context.Background(), clients, s)
		if err != nil {
			t.Fatalf("play %s: %v", name, err)
		}
		all = append(all, played{name, res})
	}
	// Leave no waiting pod behind: other tests of this package watch the
	// whole (shared) cluster's pods.
	t.Cleanup(func() {
		zero := int64(0)
		done := map[string]bool{}
		for _, p := range all {
			for _, e := range p.res.Events {
				if done[e.Namespace] {
					continue
				}
				done[e.Namespace] = true
				err := clients.Kube.CoreV1().Pods(e.Namespace).DeleteCollection(context.Background(),
					metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
				if err != nil {
					t.Errorf("delete pods in %s: %v", e.Namespace, err)
				}
			}
		}
	})

	type key struct{ uid, rv string }
	var byEvent map[key]*eventpipev1.Occurrence
	var status []*eventpipev1.Occurrence
	waitFor(t, 90*time.Second, "every played Event and the crash's pod status at the collector", func() (bool, string) {
		byEvent, status = map[key]*eventpipev1.Occurrence{}, nil
		for _, o := range col.all(t) {
			if o.GetBlocker().GetSource() == eventpipev1.PullSourcePodStatus {
				status = append(status, o)
				continue
			}
			byEvent[key{o.GetEvent().GetUid(), o.GetEvent().GetResourceVersion()}] = o
		}
		missing := 0
		for _, p := range all {
			for _, e := range p.res.Events {
				if _, ok := byEvent[key{e.UID, e.ResourceVersion}]; !ok {
					missing++
				}
			}
		}
		return missing == 0 && len(status) > 0, fmt.Sprintf("%d events missing, %d pod_status blockers", missing, len(status))
	})

	for _, p := range all {
		t.Run(p.name, func(t *testing.T) {
			blockers := 0
			for _, e := range p.res.Events {
				o, x := byEvent[key{e.UID, e.ResourceVersion}], e.Expect
				b := o.GetBlocker()
				where := fmt.Sprintf("%s %q", e.Reason, trim(e.Message))
				if x.BlockerKind == "" {
					if b != nil {
						t.Errorf("%s: unexpected blocker %+v", where, b)
					}
					continue
				}
				blockers++
				switch {
				case b == nil:
					t.Errorf("%s: no blocker, want %s/%s", where, x.BlockerKind, x.BlockerCause)
					continue
				case b.Kind != x.BlockerKind, x.CauseInMessage && b.Cause != x.BlockerCause:
					t.Errorf("%s: blocker %s/%s, want %s/%s", where, b.Kind, b.Cause, x.BlockerKind, x.BlockerCause)
				case o.GetSandbox().GetId() != x.SandboxID || b.Fix == "" || b.Object == "":
					t.Errorf("%s: sandbox %q (want %q), fix %q, object %q", where, o.GetSandbox().GetId(), x.SandboxID, b.Fix, b.Object)
				}
				if b.Container != x.Container {
					t.Errorf("%s: blocker container %q, want %q", where, b.Container, x.Container)
				}
				// The last occurrence of a repeated Event carries the count.
				switch {
				case b.Cause == eventpipev1.BlockerNoStorageClass && e.Count == 5:
					if b.Disposition != eventpipev1.DispositionPersistent || b.Attempts != 5 || b.Object != "PersistentVolumeClaim/workspace-pvc-unbound" {
						t.Errorf("%s: claim after 5 failures: %+v", where, b)
					}
				case b.Cause == eventpipev1.BlockerInsufficientResources && e.Count == 5:
					if b.Disposition != eventpipev1.DispositionRetrying || b.Attempts != 5 {
						t.Errorf("%s: capacity after 5 failures: %+v", where, b)
					}
				}
			}
			if blockers == 0 {
				t.Fatalf("scenario %s marks no blocker", p.name)
			}
			if p.name != "crash-loop" {
				return
			}
			found := false
			for _, o := range status {
				b := o.GetBlocker()
				if o.GetSandbox().GetName() == "crash-loop" && b.GetCause() == eventpipev1.BlockerExitError &&
					b.GetContainer() == scenario.ContainerAgent && b.GetKind() == eventpipev1.BlockerKindContainer {
					found = true
				}
			}
			if !found {
				t.Errorf("no pod_status blocker exit_error for the crash-loop agent container among %d", len(status))
			}
		})
	}
}

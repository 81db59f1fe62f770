package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/gateway"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// TestEndToEndSeedsOnRealWriters: the seeds (workload image missing,
// supervisor image with a bad tag) in shared and managed mode on the
// components that write them: the sandboxes are created as the OpenShell
// driver creates them (testenv/osdriver), the Agent Sandbox controller
// makes the workload pod and writes the Sandbox's Ready condition,
// kube-scheduler places the pods on a hollow node and that node's kubelet
// fails the pulls. The kubelet's own Failed Event, read back from the
// apiserver, reaches a gateway client through the agent, the collector and
// the driver proxy as a platform event with the pull keys; every stored
// occurrence of the sandbox reaches the stream once; and GetSandbox,
// ListSandboxes and WatchSandboxes carry ImagePulled=False naming the image
// beside the controller's Ready condition (which the test driver serves as
// the Rust driver would copy it: the gateway and driver are Rust and are
// not built here).
func TestEndToEndSeedsOnRealWriters(t *testing.T) {
	// A short directory: the hollow node's unix sockets live under it
	// (t.TempDir() is named after the test).
	dir, err := os.MkdirTemp("", "gwrw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cluster := kube.Start(t, kube.WithWriters(kube.AllWriters), kube.WithDir(dir))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if _, err := osdriver.StartNode(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	pl := startPipeline(t, cluster)
	drv, err := osdriver.New(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	type created struct {
		name             string
		s                osdriver.Sandbox
		role, image, pod string
		container        string // the fieldPath of the failing container
	}
	var all []created
	for i, c := range []struct {
		name string
		mode scenario.Mode
	}{
		{"img-missing", scenario.ModeShared},
		{"img-missing", scenario.ModeManaged},
		{"sup-bad", scenario.ModeShared},
		{"sup-bad", scenario.ModeManaged},
	} {
		s, err := drv.Run(ctx, c.name, osdriver.Params{Mode: c.mode, Workspace: fmt.Sprintf("real%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		cr := created{name: string(c.mode) + "/" + c.name, s: s, role: eventpipev1.ImageRoleWorkload, image: scenario.ImageMissing,
			pod: s.PodName(), container: "spec.initContainers{" + scenario.ContainerWorkspaceInit + "}"}
		if c.name == "sup-bad" {
			cr.role, cr.image, cr.pod, cr.container = eventpipev1.ImageRoleSupervisor, scenario.SupervisorImageBad, s.SupervisorPodName(),
				"spec.containers{"+scenario.ContainerSupervisor+"}"
		}
		all = append(all, cr)
	}

	for _, c := range all {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			// The kubelet's words, read back from the apiserver.
			failed := waitPodEvent(ctx, t, drv, s.Namespace(), c.pod, "Failed", `Failed to pull image "`+c.image+`": `)
			if failed.Source.Component != "kubelet" || failed.Source.Host != osdriver.NodeName || failed.InvolvedObject.FieldPath != c.container {
				t.Errorf("Failed from %+v about %q, want the kubelet of %s about %s", failed.Source, failed.InvolvedObject.FieldPath, osdriver.NodeName, c.container)
			}
			// The controller's Ready condition, served by the driver as
			// the Rust driver copies it from the CR.
			ready := waitReady(ctx, t, dyn, s)
			sb := gatewaytest.Sandbox{ID: s.ID, Name: s.Name, Namespace: s.Namespace(), Workspace: s.Workspace, Conditions: []gatewaytest.Condition{ready}}
			pl.drv.Put(sb)

			waitFor(t, 3*time.Minute, "the kubelet's Failed at the gateway", func() (bool, string) {
				for _, e := range pl.st.ofSandbox(s.ID) {
					md := e.Platform.Metadata
					if !strings.HasPrefix(md[gateway.KeyEventID], string(failed.UID)+"/") {
						continue
					}
					if e.Platform.Reason != "Failed" || e.Platform.Message != failed.Message || md[gateway.KeyPullCause] != eventpipev1.CategoryNotFound ||
						md[gateway.KeyImage] != c.image || md[gateway.KeyImageRole] != c.role || md[gateway.KeyInvolvedName] != c.pod {
						return false, fmt.Sprintf("platform event %+v", e.Platform)
					}
					return true, ""
				}
				return false, fmt.Sprintf("%d platform events of %s", len(pl.st.ofSandbox(s.ID)), s.ID)
			})

			// Every occurrence stored for the sandbox reaches the stream
			// once.
			waitFor(t, time.Minute, "every stored occurrence at the gateway, once", func() (bool, string) {
				seen := map[string]int{}
				for _, e := range pl.st.ofSandbox(s.ID) {
					seen[e.Platform.Metadata[gateway.KeyEventID]]++
				}
				n := 0
				for _, o := range readAll(t, pl.col) {
					if o.GetSandbox().GetId() != s.ID {
						continue
					}
					n++
					if k := seen[o.GetEventId()]; k != 1 {
						return false, fmt.Sprintf("occurrence %s (%s %q) reached the stream %d times", o.GetEventId(), o.GetReason(), o.GetMessage(), k)
					}
				}
				return n > 0, fmt.Sprintf("%d occurrences stored", n)
			})

			checkAnswers(t, pl.st, pl.gw, pl.drv, sb, "ImagePulled=False beside the controller's Ready", func(where string, got gatewaytest.Sandbox) (bool, string) {
				cond, has := got.Condition(gateway.ConditionImage)
				if !has || cond.Status != "False" || cond.Reason != "NotFound" {
					return false, fmt.Sprintf("%s: condition %+v (has %v)", where, cond, has)
				}
				for _, w := range []string{c.role + " image " + c.image, "not found"} {
					if !strings.Contains(cond.Message, w) {
						return false, fmt.Sprintf("%s: message %q lacks %q", where, cond.Message, w)
					}
				}
				r, _ := got.Condition("Ready")
				if r.Status != ready.Status || r.Reason != ready.Reason || !strings.HasPrefix(r.Message, ready.Message) {
					return false, fmt.Sprintf("%s: Ready %+v, the controller wrote %+v", where, r, ready)
				}
				if ready.Status == "False" && !strings.Contains(r.Message, "[eventpipe] "+cond.Message) {
					return false, fmt.Sprintf("%s: Ready message %q does not carry the cause", where, r.Message)
				}
				return true, ""
			})
		})
	}
}

// waitPodEvent waits for an Event about the object name in ns with reason
// and a message starting with prefix, as the apiserver stores it.
func waitPodEvent(ctx context.Context, t *testing.T, drv *osdriver.Driver, ns, name, reason, prefix string) corev1.Event {
	t.Helper()
	var found corev1.Event
	waitFor(t, 5*time.Minute, reason+" of "+ns+"/"+name, func() (bool, string) {
		l, err := drv.Clientset().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range l.Items {
			if e.Reason == reason && strings.HasPrefix(e.Message, prefix) {
				found = e
				return true, ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Sprintf("have %q", seen)
	})
	return found
}

// waitReady returns the Sandbox's Ready condition once the Agent Sandbox
// controller has written it.
func waitReady(ctx context.Context, t *testing.T, dyn dynamic.Interface, s osdriver.Sandbox) gatewaytest.Condition {
	t.Helper()
	var ready gatewaytest.Condition
	waitFor(t, 3*time.Minute, "the Sandbox's Ready condition", func() (bool, string) {
		cr, err := dyn.Resource(osdriver.SandboxGVR).Namespace(s.Namespace()).Get(ctx, s.CRName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(cr.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Ready" {
				ready = gatewaytest.Condition{Type: "Ready", Status: fmt.Sprint(m["status"]), Reason: fmt.Sprint(m["reason"]),
					Message: fmt.Sprint(m["message"]), LastTransitionTime: fmt.Sprint(m["lastTransitionTime"])}
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %v", conds)
	})
	return ready
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
	"github.com/eventpipe/eventpipe/sinks/gateway"
	"github.com/eventpipe/eventpipe/sinks/gateway/gatewaytest"
	"github.com/eventpipe/eventpipe/testenv/kube"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// TestEndToEndScenariosOnRealWriters: every scenario of testenv/osdriver
// on one control plane with the components that write it: the sandboxes
// are created as the OpenShell driver creates them, the Agent Sandbox
// controller makes the workload pod and writes the Sandbox's Ready
// condition, kube-scheduler places the pods on a hollow node (or says why
// it cannot), the PV controller fails the claim and that node's kubelet
// fails the pulls, the mount, the container and the probe.
//
// The seeds (workload image missing, supervisor image with a bad tag, in
// shared and managed mode): the kubelet's own Failed Event, read back from
// the apiserver, reaches a gateway client through the agent, the collector
// and the driver proxy as a platform event with the pull keys; GetSandbox,
// ListSandboxes and WatchSandboxes carry ImagePulled=False naming the image
// beside the controller's Ready condition (which the test driver serves as
// the Rust driver would copy it: the gateway and driver are Rust and are
// not built here).
//
// The other blockers: a platform event with the blocker's kind, cause and
// object reaches the gateway, and what it says is what its writer wrote:
// the Event's reason and message as the apiserver stores them (from the
// scheduler, the PV controller or the kubelet), the controller's Ready
// message for a refused creation, the pod status's exit for an OOM kill;
// the sandbox's answers gain the blocker's condition (PodScheduled,
// VolumesReady, PodCreated or ContainersRunning =False, the cause as
// reason, the object in the message) and the controller's Ready message
// gains the diagnosis, no ImagePulled condition. Where the scenario can be
// fixed as a user would (the node's taint removed, the missing Secret
// created, the quota deleted, the crashing image replaced, the readiness
// probe made to pass), the condition and the suffix go away once the
// cluster has gone on. A readiness probe that passes again writes no
// Event: its end is the agent's container readiness occurrence, read from
// the kubelet's pod status, and `eventpipe diagnose`'s view (the
// collector's Follow stream folded by sinks/diagnosis) shows the sandbox
// blocked by the probe before and clear after.
//
// For every sandbox, every occurrence stored for it reaches the stream
// once.
func TestEndToEndScenariosOnRealWriters(t *testing.T) {
	// A short directory: the hollow node's unix sockets live under it
	// (t.TempDir() is named after the test).
	dir, err := os.MkdirTemp("", "gwrw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cluster := kube.Start(t, kube.WithWriters(kube.AllWriters), kube.WithDir(dir))
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	node, err := osdriver.StartNode(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}
	pl := startPipeline(t, cluster)
	drv, err := osdriver.New(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drv.Close(); err != nil {
			t.Error(err)
		}
	})
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
	// The blockers, each in a managed workspace of its own (quota needs
	// one), created before any is checked so that they run side by side.
	var blocked []created
	for _, name := range blockerNames() {
		s, err := drv.Run(ctx, name, osdriver.Params{Mode: scenario.ModeManaged})
		if err != nil {
			t.Fatalf("scenario %s: %v", name, err)
		}
		blocked = append(blocked, created{name: name, s: s})
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
			checkOnce(t, pl, s.ID)

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

	// The blockers are checked and fixed side by side: the kubelet's mount
	// retry and the crash-loop restart back off exponentially, so a fix
	// that waits for the subtests before it meets a back-off of a minute
	// or more (no-secret's mount came back 72 s after its Secret when it
	// was fixed after crash-loop's minute, 2026-12-05).
	t.Run("blocker", func(t *testing.T) {
		for _, c := range blocked {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				checkBlocker(ctx, t, pl, drv, dyn, node, c.s, blockers[c.name])
			})
		}
	})
}

// blocker is what a blocker scenario's sandbox must show at the gateway:
// the blocker's kind, the causes its platform event may carry (crash-loop
// reads first as crash_loop, from the kubelet's BackOff, then as
// exit_error once the pod status has the exit code), and the component
// whose Event says it ("" when no Event does: a refused creation comes
// from the controller's Ready condition, an OOM kill from the pod status).
type blocker struct {
	kind   string
	causes []string
	writer string
	// fix, when set, removes the cause as a user would.
	fix func(ctx context.Context, t *testing.T, f fixer, s osdriver.Sandbox)
}

// fixer is what a fix may change: the cluster's objects and the hollow
// node's runtime.
type fixer struct {
	drv  *osdriver.Driver
	dyn  dynamic.Interface
	node *kube.Node
}

var blockers = map[string]blocker{
	"no-cpu":      {eventpipev1.BlockerKindUnschedulable, []string{eventpipev1.BlockerInsufficientResources}, "default-scheduler", nil},
	"no-memory":   {eventpipev1.BlockerKindUnschedulable, []string{eventpipev1.BlockerInsufficientResources}, "default-scheduler", nil},
	"no-gpu":      {eventpipev1.BlockerKindUnschedulable, []string{eventpipev1.BlockerInsufficientResources}, "default-scheduler", nil},
	"taint":       {eventpipev1.BlockerKindUnschedulable, []string{eventpipev1.BlockerUntoleratedTaint}, "default-scheduler", removeTaint},
	"selector":    {eventpipev1.BlockerKindUnschedulable, []string{eventpipev1.BlockerNodeSelectorMismatch}, "default-scheduler", nil},
	"pvc-unbound": {eventpipev1.BlockerKindVolume, []string{eventpipev1.BlockerNoStorageClass}, "persistentvolume-controller", nil},
	"no-secret":   {eventpipev1.BlockerKindVolume, []string{eventpipev1.BlockerSecretNotFound}, "kubelet", createSecret},
	"crash-loop":  {eventpipev1.BlockerKindContainer, []string{eventpipev1.BlockerCrashLoop, eventpipev1.BlockerExitError}, "", replaceImage},
	"oom":         {eventpipev1.BlockerKindContainer, []string{eventpipev1.BlockerOOMKilled}, "", nil},
	"unready":     {eventpipev1.BlockerKindContainer, []string{eventpipev1.BlockerReadinessProbe}, "kubelet", passReadiness},
	"quota":       {eventpipev1.BlockerKindCreateRefused, []string{eventpipev1.BlockerQuotaExceeded}, "", deleteQuota},
	"webhook":     {eventpipev1.BlockerKindCreateRefused, []string{eventpipev1.BlockerWebhookDenied}, "", nil},
}

func blockerNames() []string {
	var out []string
	for _, n := range osdriver.Names() {
		if _, ok := blockers[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// checkBlocker waits for a platform event of s at the gateway that carries
// the blocker want, and checks it against the collector's occurrence and
// what the writer wrote: the Event of that UID in the apiserver, the
// controller's Ready condition, or the pod's container status.
func checkBlocker(ctx context.Context, t *testing.T, pl *pipeline, drv *osdriver.Driver, dyn dynamic.Interface, node *kube.Node, s osdriver.Sandbox, want blocker) {
	t.Helper()
	ready := waitReady(ctx, t, dyn, s)
	sb := gatewaytest.Sandbox{ID: s.ID, Name: s.Name, Namespace: s.Namespace(), Workspace: s.Workspace, Conditions: []gatewaytest.Condition{ready}}
	pl.drv.Put(sb)

	var ev gatewaytest.WatchEvent
	waitFor(t, 5*time.Minute, "a platform event with blocker "+want.kind+" "+strings.Join(want.causes, "|"), func() (bool, string) {
		var seen []string
		for _, e := range pl.st.ofSandbox(s.ID) {
			md := e.Platform.Metadata
			if md[gateway.KeyBlockerKind] == want.kind && slices.Contains(want.causes, md[gateway.KeyBlockerCause]) {
				ev = e
				return true, ""
			}
			seen = append(seen, e.Platform.Reason+" "+md[gateway.KeyBlockerKind]+"/"+md[gateway.KeyBlockerCause])
		}
		return false, fmt.Sprintf("platform events %q", seen)
	})
	md := ev.Platform.Metadata
	id := md[gateway.KeyEventID]
	var occ *eventpipev1.Occurrence
	for _, o := range readAll(t, pl.col) {
		if o.GetEventId() == id {
			occ = o
		}
	}
	b := occ.GetBlocker()
	if b == nil {
		t.Fatalf("platform event %s has no blocker in the collector: %v", id, occ)
	}
	if md[gateway.KeyBlockerObject] != b.GetObject() || md[gateway.KeyDisposition] != b.GetDisposition() || ev.Platform.Reason != occ.GetReason() {
		t.Errorf("platform event %+v, the collector holds %v", ev.Platform, occ)
	}
	if b.GetObject() == "" {
		t.Errorf("blocker %s/%s names no object", b.GetKind(), b.GetCause())
	}

	// What its writer wrote.
	switch b.GetSource() {
	case eventpipev1.PullSourceEvent:
		uid, _, _ := strings.Cut(id, "/")
		l, err := drv.Clientset().CoreV1().Events(s.Namespace()).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var found *corev1.Event
		for i := range l.Items {
			if string(l.Items[i].UID) == uid {
				found = &l.Items[i]
			}
		}
		switch {
		case found == nil:
			t.Errorf("no Event %s in %s", uid, s.Namespace())
		case ev.Platform.Reason != found.Reason || ev.Platform.Message != found.Message:
			t.Errorf("platform event %q %q, the apiserver holds %q %q", ev.Platform.Reason, ev.Platform.Message, found.Reason, found.Message)
		case want.writer != "" && found.Source.Component != want.writer && found.ReportingController != want.writer:
			t.Errorf("Event %s %q written by %q/%q, want %s", found.Reason, found.Message, found.Source.Component, found.ReportingController, want.writer)
		case md[gateway.KeyInvolvedKind] != found.InvolvedObject.Kind || md[gateway.KeyInvolvedName] != found.InvolvedObject.Name:
			t.Errorf("involved %s/%s, the Event is about %s/%s", md[gateway.KeyInvolvedKind], md[gateway.KeyInvolvedName], found.InvolvedObject.Kind, found.InvolvedObject.Name)
		}
	case eventpipev1.PullSourceSandboxCondition:
		// The controller's words, as it wrote them on the Sandbox.
		if ready.Status != "False" || ready.Reason != "ReconcilerError" || !strings.Contains(ev.Platform.Message, ready.Message) {
			t.Errorf("platform event message %q, the controller's Ready is %+v", ev.Platform.Message, ready)
		}
	case eventpipev1.PullSourcePodStatus:
		pod, err := drv.Clientset().CoreV1().Pods(s.Namespace()).Get(ctx, s.PodName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var term *corev1.ContainerStateTerminated
		for _, cs := range pod.Status.ContainerStatuses {
			// Terminated now, or before its restart.
			if cs.Name == b.GetContainer() {
				if term = cs.State.Terminated; term == nil {
					term = cs.LastTerminationState.Terminated
				}
			}
		}
		if term == nil || !b.GetHasExitCode() || term.ExitCode != b.GetExitCode() ||
			(b.GetCause() == eventpipev1.BlockerOOMKilled) != (term.Reason == "OOMKilled") {
			t.Errorf("blocker %s exit %d (known %v), the kubelet's status of %s: %+v", b.GetCause(), b.GetExitCode(), b.GetHasExitCode(), b.GetContainer(), term)
		}
	default:
		t.Errorf("blocker source %q", b.GetSource())
	}
	t.Logf("%s %s/%s object %s from %s: %q", ev.Platform.Reason, b.GetKind(), b.GetCause(), b.GetObject(), b.GetSource(), ev.Platform.Message)

	checkOnce(t, pl, s.ID)
	// The blocker's condition beside the controller's Ready, which carries
	// the diagnosis; no pull condition is invented for a sandbox whose
	// images pull.
	typ := blockerCondition[want.kind]
	checkAnswers(t, pl.st, pl.gw, pl.drv, sb, typ+"=False beside the controller's Ready", func(where string, got gatewaytest.Sandbox) (bool, string) {
		if c, has := got.Condition(gateway.ConditionImage); has {
			return false, fmt.Sprintf("%s: %+v", where, c)
		}
		r, _ := got.Condition("Ready")
		cond, has := got.Condition(typ)
		if !has || cond.Status != "False" || !slices.Contains(reasonsOf(want.causes), cond.Reason) {
			return false, fmt.Sprintf("%s: condition %s %+v (has %v), want a reason of %v", where, typ, cond, has, want.causes)
		}
		if !strings.Contains(cond.Message, b.GetObject()) && !strings.Contains(cond.Message, strings.TrimPrefix(b.GetObject(), "Pod/")) {
			return false, fmt.Sprintf("%s: message %q does not name %s", where, cond.Message, b.GetObject())
		}
		if c := b.GetContainer(); c != "" && !strings.Contains(cond.Message, "container "+c) {
			return false, fmt.Sprintf("%s: message %q does not name container %s", where, cond.Message, c)
		}
		if r.Status != ready.Status || r.Reason != ready.Reason || !strings.HasPrefix(r.Message, ready.Message) {
			return false, fmt.Sprintf("%s: Ready %+v, the controller wrote %+v", where, r, ready)
		}
		if ready.Status == "False" && !strings.Contains(r.Message, "[eventpipe] "+cond.Message) {
			return false, fmt.Sprintf("%s: Ready message %q does not carry the cause", where, r.Message)
		}
		return true, ""
	})
	probe := b.GetCause() == eventpipev1.BlockerReadinessProbe
	if probe {
		checkDiagnosis(ctx, t, pl, s, func(d diagnosis.Diagnosis) (bool, string) {
			for _, bl := range d.Blockers {
				if bl.Cause == eventpipev1.BlockerReadinessProbe && bl.Container == b.GetContainer() {
					return true, ""
				}
			}
			return false, fmt.Sprintf("state %s, blockers %+v", d.State, d.Blockers)
		})
	}
	if want.fix == nil {
		return
	}
	want.fix(ctx, t, fixer{drv, dyn, node}, s)
	// The cluster goes on (the kubelet's mount retry, the controller's
	// retry, the scheduler's, a crash-looping container that must stay up
	// a minute): minutes, on a loaded machine.
	checkAnswersWithin(t, 8*time.Minute, pl.st, pl.gw, pl.drv, sb, "no "+typ+" once fixed", func(where string, got gatewaytest.Sandbox) (bool, string) {
		if c, has := got.Condition(typ); has {
			return false, fmt.Sprintf("%s: %+v", where, c)
		}
		if r, _ := got.Condition("Ready"); r != ready {
			return false, fmt.Sprintf("%s: Ready %+v, the controller wrote %+v", where, r, ready)
		}
		return true, ""
	})
	if !probe {
		return
	}
	// What ended it: the agent's report that the container is ready, from
	// the kubelet's pod status; and what `eventpipe diagnose` reads.
	found := false
	for _, o := range readAll(t, pl.col) {
		if eventpipev1.IsContainerReady(o) && o.GetSandbox().GetId() == s.ID && o.GetContainer() == b.GetContainer() {
			found = true
			t.Logf("ended by %s %s at %s (the blocker last seen %s)", o.GetReason(), o.GetEventId(),
				o.GetOccurredAt().AsTime().Format(time.RFC3339Nano), b.GetLastSeen().AsTime().Format(time.RFC3339))
		}
	}
	if !found {
		t.Errorf("no container readiness occurrence of container %s of %s at the collector", b.GetContainer(), s.ID)
	}
	checkDiagnosis(ctx, t, pl, s, func(d diagnosis.Diagnosis) (bool, string) {
		return !d.Blocked(), fmt.Sprintf("state %s, blockers %+v", d.State, d.Blockers)
	})
}

// checkDiagnosis waits until `eventpipe diagnose`'s view of s (the
// collector's Follow stream replayed into a sinks/diagnosis Folder) passes
// check.
func checkDiagnosis(ctx context.Context, t *testing.T, pl *pipeline, s osdriver.Sandbox, check func(diagnosis.Diagnosis) (bool, string)) {
	t.Helper()
	conn, err := grpc.NewClient(pl.col.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, 2*time.Minute, "the diagnosis of "+s.Name, func() (bool, string) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		f, _, err := diagnosis.Read(rctx, eventpipev1.NewFollowClient(conn), &eventpipev1.FollowRequest{SandboxId: s.ID, Tail: 10000})
		if err != nil {
			return false, err.Error()
		}
		d, ok := f.Sandbox(s.ID)
		if !ok {
			return false, "no diagnosis"
		}
		return check(d)
	})
}

// blockerCondition is the condition type of each blocker kind.
var blockerCondition = map[string]string{
	eventpipev1.BlockerKindUnschedulable: gateway.ConditionScheduled,
	eventpipev1.BlockerKindVolume:        gateway.ConditionVolumes,
	eventpipev1.BlockerKindCreateRefused: gateway.ConditionCreated,
	eventpipev1.BlockerKindContainer:     gateway.ConditionContainers,
}

// reasonsOf: the condition reasons of causes (CamelCase; OOMKilled as
// Kubernetes spells it).
func reasonsOf(causes []string) []string {
	var out []string
	for _, c := range causes {
		var b strings.Builder
		for _, w := range strings.Split(c, "_") {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
		out = append(out, strings.Replace(b.String(), "OomKilled", "OOMKilled", 1))
	}
	return out
}

// removeTaint takes the taint off the node (only scenario taint does not
// tolerate it).
func removeTaint(ctx context.Context, t *testing.T, f fixer, _ osdriver.Sandbox) {
	t.Helper()
	nodes := f.drv.Clientset().CoreV1().Nodes()
	n, err := nodes.Get(ctx, osdriver.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == osdriver.TaintKey })
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createSecret creates the Secret the pod mounts.
func createSecret(ctx context.Context, t *testing.T, f fixer, s osdriver.Sandbox) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-credentials", Namespace: s.Namespace()},
		StringData: map[string]string{"token": "e2e"}}
	if _, err := f.drv.Clientset().CoreV1().Secrets(s.Namespace()).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deleteQuota deletes the quota and touches the Sandbox, as the
// controller's own retry would come back to it: its back-off may have
// grown to minutes by the time this subtest runs.
func deleteQuota(ctx context.Context, t *testing.T, f fixer, s osdriver.Sandbox) {
	t.Helper()
	if err := f.drv.Clientset().CoreV1().ResourceQuotas(s.Namespace()).Delete(ctx, "sandbox-pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"annotations":{"eventpipe.test/quota-lifted":"true"}}}`)
	if _, err := f.dyn.Resource(osdriver.SandboxGVR).Namespace(s.Namespace()).Patch(ctx, s.CRName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// replaceImage gives the crashing agent container an image that runs (a
// pod's container image may be changed in place; the kubelet restarts the
// container with it).
func replaceImage(ctx context.Context, t *testing.T, f fixer, s osdriver.Sandbox) {
	t.Helper()
	pods := f.drv.Clientset().CoreV1().Pods(s.Namespace())
	pod, err := pods.Get(ctx, s.PodName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == scenario.ContainerAgent {
			pod.Spec.Containers[i].Image = scenario.DefaultWorkloadImage
		}
	}
	if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// passReadiness makes the readiness probe pass (the file it reads now
// exists): the kubelet marks the container ready and writes no Event.
func passReadiness(_ context.Context, t *testing.T, f fixer, _ osdriver.Sandbox) {
	t.Helper()
	if err := osdriver.PassReadiness(f.node); err != nil {
		t.Fatal(err)
	}
}

// checkOnce waits until every occurrence the collector stored for the
// sandbox id has reached the gateway's stream exactly once.
func checkOnce(t *testing.T, pl *pipeline, id string) {
	t.Helper()
	waitFor(t, time.Minute, "every stored occurrence at the gateway, once", func() (bool, string) {
		seen := map[string]int{}
		for _, e := range pl.st.ofSandbox(id) {
			seen[e.Platform.Metadata[gateway.KeyEventID]]++
		}
		n := 0
		for _, o := range readAll(t, pl.col) {
			if o.GetSandbox().GetId() != id {
				continue
			}
			n++
			if k := seen[o.GetEventId()]; k != 1 {
				return false, fmt.Sprintf("occurrence %s (%s %q) reached the stream %d times", o.GetEventId(), o.GetReason(), o.GetMessage(), k)
			}
		}
		return n > 0, fmt.Sprintf("%d occurrences stored", n)
	})
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

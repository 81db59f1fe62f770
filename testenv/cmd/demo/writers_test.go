package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/sinks/diagnosis"
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// `make run --scenarios ...`, in managed and shared mode (TestMakeRun runs
// the default scenarios): the sandboxes are created as the OpenShell driver
// creates them, and every Event and condition comes from the hollow node's
// kubelet, kube-scheduler, kube-controller-manager's
// persistentvolume-controller and the Agent Sandbox controller (see
// checkWriters).
func TestMakeRunWriters(t *testing.T) {
	for _, tc := range []struct {
		mode      scenario.Mode
		scenarios []string
	}{
		{scenario.ModeManaged, []string{"no-memory", "no-gpu", "no-secret", "crash-loop", "oom", "unready", "quota", "healthy"}},
		// webhook in shared mode: its webhook denies the one sandbox's
		// pod among the others of the namespace.
		{scenario.ModeShared, []string{"img-missing", "sup-bad", "pvc-unbound", "no-cpu", "webhook"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			dataDir := shortDataDir(t)
			cli := buildCLI(t)
			c := startChild(t, "--plain", "--data-dir", dataDir, "--cli", cli, "--mode", string(tc.mode), "--scenarios", strings.Join(tc.scenarios, ","))
			checkWriters(t, c, dataDir, tc.mode, tc.scenarios)
			c.stopAndCheck(t, dataDir)
		})
	}
}

// blocked is what the diagnosis must say for a scenario's sandbox: the
// blocker kind and cause a row of the view shows. crash-loop reads first as
// crash_loop (the kubelet's BackOff); once the pod status carries the last
// exit code 1 the diagnosis names that (exit_error), and oom's names the
// OOM kill. unready's is the kubelet's readiness probe failures, once they
// last (three in a row). quota's and webhook's come from no Event: the
// agent reads the Agent Sandbox controller's Ready condition.
var blocked = map[string][2]string{
	"unready":     {eventpipev1.BlockerKindContainer, eventpipev1.BlockerReadinessProbe},
	"quota":       {eventpipev1.BlockerKindCreateRefused, eventpipev1.BlockerQuotaExceeded},
	"webhook":     {eventpipev1.BlockerKindCreateRefused, eventpipev1.BlockerWebhookDenied},
	"pvc-unbound": {eventpipev1.BlockerKindVolume, eventpipev1.BlockerNoStorageClass},
	"no-cpu":      {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources},
	"no-memory":   {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources},
	"no-gpu":      {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources},
	"no-secret":   {eventpipev1.BlockerKindVolume, eventpipev1.BlockerSecretNotFound},
	"crash-loop":  {eventpipev1.BlockerKindContainer, eventpipev1.BlockerExitError},
	"oom":         {eventpipev1.BlockerKindContainer, eventpipev1.BlockerOOMKilled},
	"taint":       {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerUntoleratedTaint},
	"selector":    {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerNodeSelectorMismatch},
}

// kubeletSays is an Event the kubelet writes about a scenario's workload
// pod: its reason and the start of its message.
var kubeletSays = map[string][2]string{
	"no-secret":  {"FailedMount", `MountVolume.SetUp failed for volume "credentials" : secret "sandbox-credentials" not found`},
	"crash-loop": {"BackOff", "Back-off restarting failed container agent in pod "},
	"oom":        {"BackOff", "Back-off restarting failed container agent in pod "},
	"unready":    {"Unhealthy", "Readiness probe failed: cat: can't open '/tmp/ready'"},
}

// pullFailed is what the diagnosis must say for a seed: the image role
// and the image whose pull the kubelet reported failing, and the pod and
// container (fieldPath) of its Events.
var pullFailed = map[string]struct{ role, image, container string }{
	"img-missing": {eventpipev1.ImageRoleWorkload, scenario.ImageMissing, "spec.initContainers{" + scenario.ContainerWorkspaceInit + "}"},
	"sup-bad":     {eventpipev1.ImageRoleSupervisor, scenario.SupervisorImageBad, "spec.containers{" + scenario.ContainerSupervisor + "}"},
}

// checkWriters checks a running `make run` whose sandboxes are the given
// scenarios: it reads back from the apiserver what the writers wrote (the
// kubelet's pull Events for the seeds, the scheduler's Scheduled, the Agent
// Sandbox controller's Ready condition), checks that each of their Events
// reached the file sink unchanged and attributed to its sandbox, and that
// the Follow stream's diagnosis (the live view and `eventpipe diagnose`)
// names the blocker they describe.
func checkWriters(t *testing.T, c *child, dataDir string, mode scenario.Mode, scenarios []string) {
	t.Helper()
	c.waitFor(t, "the control plane, its writers and the hollow node", 10*time.Minute, func(out string) bool { return strings.Contains(out, "kubeconfig     ") })
	out := c.output()
	kubeconfig := strings.Fields(out[strings.Index(out, "kubeconfig     ")+len("kubeconfig     "):])[0]
	for _, w := range []string{"kube-scheduler (pid", "kube-controller-manager (pid", "agent-sandbox-controller (pid", "node           " + osdriver.NodeName + ": a real kubelet (pid"} {
		if !strings.Contains(out, w) {
			t.Errorf("start-up lines lack %q", w)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The view: a row per sandbox, the blocker its writer reported.
	c.waitFor(t, "every blocker in the view", 6*time.Minute, func(out string) bool {
		for _, name := range scenarios {
			if b, ok := blocked[name]; ok && !rowHas(out, name, "BLOCKED", b[0], b[1]) {
				return false
			}
			if p, ok := pullFailed[name]; ok && !rowHas(out, name, "BLOCKED", p.role, p.image, eventpipev1.CategoryNotFound) {
				return false
			}
		}
		return true
	})

	// What the writers wrote, read back from the apiserver.
	sandboxes := map[string]*unstructured.Unstructured{} // scenario -> CR
	for _, name := range scenarios {
		_, s, err := osdriver.Build(name, osdriver.Params{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		cr, err := dyn.Resource(osdriver.SandboxGVR).Namespace(s.Namespace()).Get(ctx, s.CRName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("sandbox %s: %v", name, err)
		}
		sandboxes[name] = cr
	}
	supervisorPod := func(cr *unstructured.Unstructured) string {
		return "os-supervisor-" + strings.ToLower(cr.GetAnnotations()["openshell.ai/sandbox-id"])
	}
	// The Agent Sandbox controller's Ready condition, from the workload
	// pod as the kubelet reports it: sup-bad's workload pod runs (only its
	// supervisor pod cannot pull), as in the seed.
	for name, cr := range sandboxes {
		status, reason, msg := "False", "DependenciesNotReady", "Pod exists with phase: Pending"
		switch name {
		case "quota":
			reason, msg = "ReconcilerError", "exceeded quota: sandbox-pods"
		case "webhook":
			// The API server's words for the denial of our webhook.
			reason, msg = "ReconcilerError", `admission webhook "`+osdriver.WebhookName+`" denied the request: `+osdriver.WebhookMessage
		case "healthy", "sup-bad":
			status, reason, msg = "True", "DependenciesReady", "Pod is Ready"
		case "crash-loop", "oom", "unready":
			msg = "Pod is Running but not Ready"
		}
		waitCondition(ctx, t, dyn, cr, status, reason, msg)
	}
	// Scheduled for both pods of each seed: the scheduler's words; then
	// the kubelet's pull Events for the failing image, on the pod and
	// container that name it.
	for _, name := range []string{"img-missing", "sup-bad"} {
		cr, ok := sandboxes[name]
		if !ok {
			continue
		}
		for _, pod := range []string{cr.GetName(), supervisorPod(cr)} {
			e := waitEvent(ctx, t, cs, cr.GetNamespace(), pod, "Scheduled", nil)
			want := fmt.Sprintf("Successfully assigned %s/%s to %s", cr.GetNamespace(), pod, osdriver.NodeName)
			if e.Message != want || e.ReportingController != "default-scheduler" {
				t.Errorf("%s: Scheduled %q by %q, want %q by default-scheduler", pod, e.Message, e.ReportingController, want)
			}
		}
		p := pullFailed[name]
		pod := cr.GetName()
		if name == "sup-bad" {
			pod = supervisorPod(cr)
		}
		img := p.image
		for _, w := range []struct{ reason, message string }{
			{"Pulling", `Pulling image "` + img + `"`},
			{"Failed", `Failed to pull image "` + img + `": rpc error: code = NotFound desc = failed to pull and unpack image "` + img +
				`": failed to resolve reference "` + img + `": ` + img + `: not found`},
			{"Failed", "Error: ErrImagePull"},
			{"BackOff", `Back-off pulling image "` + img + `"`},
			{"Failed", "Error: ImagePullBackOff"},
		} {
			e := waitEvent(ctx, t, cs, cr.GetNamespace(), pod, w.reason, equals(w.message))
			if e.Source.Component != "kubelet" || e.Source.Host != osdriver.NodeName || e.InvolvedObject.FieldPath != p.container {
				t.Errorf("%s %s %q: from %+v about %q, want the kubelet of %s about %s", pod, w.reason, w.message, e.Source, e.InvolvedObject.FieldPath, osdriver.NodeName, p.container)
			}
		}
	}

	// The kubelet's words for the other troubles of a running pod.
	for name, w := range kubeletSays {
		cr, ok := sandboxes[name]
		if !ok {
			continue
		}
		e := waitEvent(ctx, t, cs, cr.GetNamespace(), cr.GetName(), w[0], func(m string) bool { return strings.HasPrefix(m, w[1]) })
		if e.Source.Component != "kubelet" || e.InvolvedObject.FieldPath != "spec.containers{agent}" && name != "no-secret" {
			t.Errorf("%s: %s %q from %+v about %q, want the kubelet about the agent container", name, e.Reason, e.Message, e.Source, e.InvolvedObject.FieldPath)
		}
	}

	// Every Event those components wrote about the sandboxes' objects is
	// in the file sink, unchanged, with its sandbox's id.
	writers := map[string]bool{"kubelet": true, "default-scheduler": true, "persistentvolume-controller": true, "sandbox-controller": true}
	namespaces := map[string]bool{}
	for _, cr := range sandboxes {
		namespaces[cr.GetNamespace()] = true
	}
	var written []corev1.Event
	byWriter := map[string]int{}
	for ns := range namespaces {
		l, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Items {
			if writers[e.ReportingController] || writers[e.Source.Component] {
				written = append(written, e)
				byWriter[e.ReportingController+e.Source.Component]++
			}
		}
	}
	t.Logf("%d Events from the writers (%v)", len(written), byWriter)
	if len(written) < len(scenarios) {
		t.Fatalf("only %d Events from the writers", len(written))
	}
	idOf := func(e corev1.Event) string {
		for _, cr := range sandboxes {
			id := cr.GetAnnotations()["openshell.ai/sandbox-id"]
			if e.Namespace != cr.GetNamespace() {
				continue
			}
			switch e.InvolvedObject.Name {
			case cr.GetName(), supervisorPod(cr), "workspace-" + cr.GetName():
				return id
			}
		}
		return ""
	}
	var sink map[string]map[string]any
	c.waitFor(t, "the writers' Events in the file sink", 2*time.Minute, func(string) bool {
		sink = readSink(t, filepath.Join(dataDir, "events.jsonl"))
		for _, e := range written {
			if _, ok := sink[string(e.UID)]; !ok {
				return false
			}
		}
		return true
	})
	for _, e := range written {
		o := sink[string(e.UID)]
		where := fmt.Sprintf("%s %s/%s %q", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
		if o["reason"] != e.Reason || o["message"] != e.Message {
			t.Errorf("%s: the file sink has reason %v, message %v", where, o["reason"], o["message"])
		}
		sb, _ := o["sandbox"].(map[string]any)
		if want := idOf(e); want != "" && (sb == nil || sb["id"] != want) {
			t.Errorf("%s: sandbox %v in the file sink, want id %s", where, sb, want)
		}
	}

	// `eventpipe diagnose` (the Follow stream) names the blocker.
	c.waitFor(t, "where the data went", 2*time.Minute, func(out string) bool { return strings.Contains(out, "where the data went:") })
	out = c.output()
	try := strings.Fields(strings.SplitN(out[strings.LastIndex(out, "  try         "):], "\n", 2)[0])[1:]
	diagnose := tryCommand(t, try)
	for name, cr := range sandboxes {
		ws := cr.GetAnnotations()["openshell.ai/sandbox-workspace"]
		code, o := diagnose(name, "-w", ws, "-o", "json")
		if b, ok := blocked[name]; ok && (code != 1 || !strings.Contains(o, `"kind": "`+b[0]+`"`) || !strings.Contains(o, `"cause": "`+b[1]+`"`)) {
			t.Errorf("eventpipe diagnose %s -w %s: exit %d, want 1 and %s/%s\n%s", name, ws, code, b[0], b[1], o)
		}
		if p, ok := pullFailed[name]; ok && (code != 1 || !strings.Contains(o, `"image_role": "`+p.role+`"`) ||
			!strings.Contains(o, `"image": "`+p.image+`"`) || !strings.Contains(o, `"cause": "`+eventpipev1.CategoryNotFound+`"`)) {
			t.Errorf("eventpipe diagnose %s -w %s: exit %d, want 1 and the %s image %s not found\n%s", name, ws, code, p.role, p.image, o)
		}
		if name == "healthy" && code != 0 {
			t.Errorf("eventpipe diagnose healthy -w %s: exit %d, want 0\n%s", ws, code, o)
		}
		if w, ok := blockerSays[name]; ok {
			checkBlocker(t, name, o, w)
		}
	}

	// The refusals no Event reports reach the file sink as the agent's
	// sandbox condition occurrences, with the controller's words.
	for name, cr := range sandboxes {
		b, ok := blocked[name]
		if !ok || b[0] != eventpipev1.BlockerKindCreateRefused {
			continue
		}
		found := false
		for _, o := range sink {
			ev, _ := o["event_id"].(string)
			bl, _ := o["blocker"].(map[string]any)
			sb, _ := o["sandbox"].(map[string]any)
			if strings.HasPrefix(ev, eventpipev1.SandboxConditionEventIDPrefix+string(cr.GetUID())+"/") && bl["cause"] == b[1] &&
				bl["source"] == eventpipev1.PullSourceSandboxCondition && sb["id"] == cr.GetAnnotations()["openshell.ai/sandbox-id"] &&
				o["reason"] == "ReconcilerError" && strings.HasPrefix(fmt.Sprint(o["message"]), "Error seen: ") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no sandbox condition occurrence with %s in the file sink", name, b[1])
		}
	}
}

// blockerSays is what diagnose's blocker must further say for a
// scenario: the object it names and words of its detail, read from what
// the writer wrote (the probe's output as the kubelet reports the
// runtime's answer, the API server's refusal).
var blockerSays = map[string]struct{ object, container, detail string }{
	"unready": {"Pod/unready", scenario.ContainerAgent, "Readiness probe failed: cat: can't open '/tmp/ready'"},
	"quota":   {"ResourceQuota/sandbox-pods", "", `pods "quota" is forbidden: exceeded quota: sandbox-pods`},
	"webhook": {"AdmissionWebhook/" + osdriver.WebhookName, "", `admission webhook "` + osdriver.WebhookName + `" denied the request: ` + osdriver.WebhookMessage},
}

// checkBlocker reads diagnose's JSON answer for a sandbox and checks that
// its blocker of want's object names the container and carries the words.
func checkBlocker(t *testing.T, name, out string, want struct{ object, container, detail string }) {
	t.Helper()
	var d diagnosis.Diagnosis
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Errorf("eventpipe diagnose %s -o json: %v\n%s", name, err, out)
		return
	}
	for _, b := range d.Blockers {
		if b.Object == want.object || b.Involved == want.object && b.Object == "" {
			if b.Container != want.container || !strings.Contains(b.Detail, want.detail) || b.Remedy == "" {
				t.Errorf("eventpipe diagnose %s: blocker %s/%s on %s, container %q, detail %q, fix %q; want container %q and %q in the detail",
					name, b.Kind, b.Cause, b.Object, b.Container, b.Detail, b.Remedy, want.container, want.detail)
			}
			return
		}
	}
	t.Errorf("eventpipe diagnose %s: no blocker on %s in %+v", name, want.object, d.Blockers)
}

// readSink returns the file sink's occurrences by Event UID.
func readSink(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]map[string]any{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var o map[string]any
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatalf("file sink line %q: %v", sc.Text(), err)
		}
		if ev, ok := o["event"].(map[string]any); ok {
			if uid, _ := ev["uid"].(string); uid != "" {
				out[uid] = o
			}
		}
	}
	return out
}

// waitEvent waits for an Event about the object name in ns with reason
// and, unless match is nil, a message it accepts.
func waitEvent(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, reason string, match func(string) bool) corev1.Event {
	t.Helper()
	var seen []string
	for {
		l, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err == nil {
			seen = seen[:0]
			for _, e := range l.Items {
				if e.Reason == reason && (match == nil || match(e.Message)) {
					return e
				}
				seen = append(seen, e.Reason+": "+e.Message)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no matching %s Event for %s/%s: %v (last error %v; have %q)", reason, ns, name, ctx.Err(), err, seen)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func equals(s string) func(string) bool { return func(m string) bool { return m == s } }

// waitCondition waits until the Sandbox's Ready condition has status,
// reason and a message containing msg.
func waitCondition(ctx context.Context, t *testing.T, dyn dynamic.Interface, cr *unstructured.Unstructured, status, reason, msg string) {
	t.Helper()
	var last any
	for {
		got, err := dyn.Resource(osdriver.SandboxGVR).Namespace(cr.GetNamespace()).Get(ctx, cr.GetName(), metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] != "Ready" {
					continue
				}
				last = m
				if m["status"] == status && m["reason"] == reason && strings.Contains(fmt.Sprint(m["message"]), msg) {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox %s/%s: Ready condition %v, want %s, reason %s with %q", cr.GetNamespace(), cr.GetName(), last, status, reason, msg)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

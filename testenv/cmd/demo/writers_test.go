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
	"github.com/eventpipe/eventpipe/testenv/osdriver"
	"github.com/eventpipe/eventpipe/testenv/scenario"
)

// `make run ARGS=--writers`, in managed and shared mode: the sandboxes are
// created as the OpenShell driver creates them, and every Event and
// condition comes from kube-scheduler, kube-controller-manager's
// persistentvolume-controller and the Agent Sandbox controller. The test
// reads back from the apiserver what those components wrote and checks
// that each of their Events reached the file sink unchanged and attributed
// to its sandbox, that the Follow stream's diagnosis (the live view and
// `eventpipe diagnose`) names the blocker they describe, and that nothing
// is left running after Ctrl-C.
func TestMakeRunWriters(t *testing.T) {
	for _, tc := range []struct {
		mode      scenario.Mode
		scenarios []string
	}{
		{scenario.ModeManaged, []string{"img-missing", "sup-bad", "pvc-unbound", "no-cpu", "no-memory", "taint", "selector", "quota", "healthy"}},
		{scenario.ModeShared, []string{"img-missing", "sup-bad", "pvc-unbound", "no-cpu"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) { runWriters(t, tc.mode, tc.scenarios) })
	}
}

// blocked is what the diagnosis must say for a scenario's sandbox: the
// blocker kind and cause a row of the view shows.
var blocked = map[string][2]string{
	"pvc-unbound": {eventpipev1.BlockerKindVolume, eventpipev1.BlockerNoStorageClass},
	"no-cpu":      {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources},
	"no-memory":   {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerInsufficientResources},
	"taint":       {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerUntoleratedTaint},
	"selector":    {eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerNodeSelectorMismatch},
}

func runWriters(t *testing.T, mode scenario.Mode, scenarios []string) {
	dataDir := filepath.Join(t.TempDir(), "data")
	cli := buildCLI(t)
	c := startChild(t, "--writers", "--plain", "--data-dir", dataDir, "--cli", cli, "--mode", string(mode), "--scenarios", strings.Join(scenarios, ","))
	c.waitFor(t, "the control plane and its writers", 10*time.Minute, func(out string) bool { return strings.Contains(out, "kubeconfig     ") })
	out := c.output()
	kubeconfig := strings.Fields(out[strings.Index(out, "kubeconfig     ")+len("kubeconfig     "):])[0]
	for _, w := range []string{"kube-scheduler (pid", "kube-controller-manager (pid", "agent-sandbox-controller (pid"} {
		if !strings.Contains(out, w) {
			t.Errorf("writers line lacks %q", w)
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
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The view: a row per sandbox, the blocker its writer reported.
	c.waitFor(t, "every blocker in the view", 5*time.Minute, func(out string) bool {
		for _, name := range scenarios {
			if b, ok := blocked[name]; ok && !rowHas(out, name, "BLOCKED", b[0], b[1]) {
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
	// The Agent Sandbox controller's Ready condition.
	for name, cr := range sandboxes {
		wantReason, wantMsg := "DependenciesNotReady", "Pod exists with phase: Pending"
		if name == "quota" {
			wantReason, wantMsg = "ReconcilerError", "exceeded quota: sandbox-pods"
		}
		waitCondition(ctx, t, dyn, cr, wantReason, wantMsg)
	}
	// Scheduled for both pods of each seed: the scheduler's words.
	for _, name := range []string{"img-missing", "sup-bad"} {
		cr := sandboxes[name]
		id := cr.GetAnnotations()["openshell.ai/sandbox-id"]
		for _, pod := range []string{cr.GetName(), "os-supervisor-" + strings.ToLower(id)} {
			e := waitEvent(ctx, t, cs, cr.GetNamespace(), pod, "Scheduled")
			want := fmt.Sprintf("Successfully assigned %s/%s to %s", cr.GetNamespace(), pod, osdriver.NodeName)
			if e.Message != want || e.ReportingController != "default-scheduler" {
				t.Errorf("%s: Scheduled %q by %q, want %q by default-scheduler", pod, e.Message, e.ReportingController, want)
			}
		}
	}

	// Every Event those components wrote about the sandboxes' objects is
	// in the file sink, unchanged, with its sandbox's id.
	writers := map[string]bool{"default-scheduler": true, "persistentvolume-controller": true, "sandbox-controller": true}
	namespaces := map[string]bool{}
	for _, cr := range sandboxes {
		namespaces[cr.GetNamespace()] = true
	}
	var written []corev1.Event
	for ns := range namespaces {
		l, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Items {
			if writers[e.ReportingController] || writers[e.Source.Component] {
				written = append(written, e)
			}
		}
	}
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
			case cr.GetName(), "os-supervisor-" + strings.ToLower(id), "workspace-" + cr.GetName():
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
	for name, b := range blocked {
		cr, ok := sandboxes[name]
		if !ok {
			continue
		}
		ws := cr.GetAnnotations()["openshell.ai/sandbox-workspace"]
		code, o := diagnose(name, "-w", ws, "-o", "json")
		if code != 1 || !strings.Contains(o, `"kind": "`+b[0]+`"`) || !strings.Contains(o, `"cause": "`+b[1]+`"`) {
			t.Errorf("eventpipe diagnose %s -w %s: exit %d, want 1 and %s/%s\n%s", name, ws, code, b[0], b[1], o)
		}
	}
	c.stopAndCheck(t, dataDir)
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

func waitEvent(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, reason string) corev1.Event {
	t.Helper()
	for {
		l, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err == nil {
			for _, e := range l.Items {
				if e.Reason == reason {
					return e
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no %s Event for %s/%s: %v (last error %v)", reason, ns, name, ctx.Err(), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitCondition waits until the Sandbox's Ready condition has reason and a
// message containing msg.
func waitCondition(ctx context.Context, t *testing.T, dyn dynamic.Interface, cr *unstructured.Unstructured, reason, msg string) {
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
				if m["status"] == "False" && m["reason"] == reason && strings.Contains(fmt.Sprint(m["message"]), msg) {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox %s/%s: Ready condition %v, want reason %s with %q", cr.GetNamespace(), cr.GetName(), last, reason, msg)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

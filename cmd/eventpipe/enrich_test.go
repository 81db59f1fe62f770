//go:build !agentonly

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func runEnrichCmd(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := runEnrich(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestEnrichDemoTable(t *testing.T) {
	code, out, stderr := runEnrichCmd(t, "", "--demo", "--output", "table")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// Compare with runs of spaces collapsed: the columns are aligned.
	var norm []string
	for _, line := range strings.Split(out, "\n") {
		norm = append(norm, strings.Join(strings.Fields(line), " "))
	}
	flat := strings.Join(norm, "\n")
	for _, want := range []string{
		"SANDBOX WORKSPACE STATE DIAGNOSIS",
		"img-missing workspace=repro BLOCKED workload image docker.io/library/busybox:0.0.0-does-not-exist: not_found (persistent, 7 failures)",
		"sup-bad workspace=repro BLOCKED supervisor image ghcr.io/nvidia/openshell/supervisor:0.0.0-does-not-exist: not_found (persistent, 5 failures)",
		"1 events not attributed to any sandbox",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// occ is the subset of an output line the tests read.
type occ struct {
	EventID    string    `json:"event_id"`
	OccurredAt time.Time `json:"occurred_at"`
	Reason     string    `json:"reason"`
	Role       string    `json:"role"`
	Container  string    `json:"container"`
	Image      string    `json:"image"`
	ImageRole  string    `json:"image_role"`
	Attr       string    `json:"attribution"`
	Sandbox    *struct {
		ID        string `json:"id"`
		Name      string `json:"name"`
		Workspace string `json:"workspace"`
	} `json:"sandbox"`
	PullFailure *struct {
		Category    string `json:"category"`
		Image       string `json:"image"`
		Disposition string `json:"disposition"`
		Attempts    int    `json:"attempts"`
		Source      string `json:"source"`
	} `json:"pull_failure"`
	Progress *struct {
		CompleteStep string `json:"complete_step"`
		ActiveStep   string `json:"active_step"`
	} `json:"progress"`
}

func parseLines(t *testing.T, out string) []occ {
	t.Helper()
	var occs []occ
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var o occ
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i, err, line)
		}
		if strings.Contains(line, "eventId") || strings.Contains(line, "occurredAt") {
			t.Fatalf("line %d uses camelCase names: %s", i, line)
		}
		occs = append(occs, o)
	}
	return occs
}

func TestEnrichDemoJSON(t *testing.T) {
	code, out, stderr := runEnrichCmd(t, "", "--demo", "--cluster", "kind-osrepro")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, `"cluster":"kind-osrepro"`) {
		t.Fatal("cluster not stamped")
	}
	occs := parseLines(t, out)
	if len(occs) != 36 {
		t.Errorf("%d occurrences, want 36 (34 events + 2 pod statuses)", len(occs))
	}
	var sawBootstrapPulled, sawInherited, sawStatus, sawSupervisor bool
	for i, o := range occs {
		if i > 0 && o.OccurredAt.Before(occs[i-1].OccurredAt) {
			t.Fatalf("line %d out of time order", i)
		}
		switch {
		case o.Reason == "Pulled" && o.Container == "openshell-sandbox-bootstrap":
			sawBootstrapPulled = true
			if o.Progress != nil || o.ImageRole != "bootstrap" {
				t.Errorf("bootstrap Pulled: progress %+v image_role %q", o.Progress, o.ImageRole)
			}
		case o.Reason == "BackOff" && o.Container == "workspace-init":
			sawInherited = true
			if o.PullFailure == nil || o.PullFailure.Category != "not_found" || o.PullFailure.Disposition != "persistent" {
				t.Errorf("bare back-off did not inherit the cause: %+v", o.PullFailure)
			}
		case o.PullFailure != nil && o.PullFailure.Source == "pod_status" && o.Role == "supervisor":
			sawSupervisor = true
			if o.ImageRole != "supervisor" || o.Sandbox == nil || o.Sandbox.Name != "sup-bad" || o.Attr != "pod_annotation" {
				t.Errorf("supervisor pod status: %+v", o)
			}
		case o.PullFailure != nil && o.PullFailure.Source == "pod_status":
			sawStatus = true
			if o.Sandbox == nil || o.Sandbox.ID != "2ff21e26-1a7b-49a2-a640-14ae153f93ea" || o.Sandbox.Workspace != "repro" || o.ImageRole != "workload" {
				t.Errorf("workload pod status: %+v", o)
			}
		}
	}
	if !sawBootstrapPulled || !sawInherited || !sawStatus || !sawSupervisor {
		t.Fatalf("missing cases: bootstrap %v inherited %v status %v supervisor %v", sawBootstrapPulled, sawInherited, sawStatus, sawSupervisor)
	}
	// The output is stable: the same input gives the same bytes.
	if _, again, _ := runEnrichCmd(t, "", "--demo", "--cluster", "kind-osrepro"); again != out {
		t.Fatal("output differs between two runs")
	}
}

// A stream of objects (not a List), both Event APIs, v1alpha1 CR, and
// objects enrich does not use.
func TestEnrichStream(t *testing.T) {
	in := `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"team-a"}}
{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"team-a"}}
{"apiVersion":"agents.x-k8s.io/v1alpha1","kind":"Sandbox","metadata":{"name":"box","namespace":"team-a","uid":"cr-1","annotations":{"openshell.io/sandbox-id":"11111111-2222-4333-8444-555555555555"}}}
{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"box.1","namespace":"team-a","uid":"e2","resourceVersion":"9"},"eventTime":"2026-10-29T10:00:01.5Z","series":{"count":3,"lastObservedTime":"2026-10-29T10:05:00.000001Z"},"regarding":{"kind":"Pod","namespace":"team-a","name":"box","fieldPath":"spec.containers{agent}"},"reason":"Failed","note":"Failed to pull image \"registry.local/box:1\": rpc error: code = Unknown desc = failed to pull and unpack image \"registry.local/box:1\": failed to resolve reference \"registry.local/box:1\": unexpected status from HEAD request to https://registry.local/v2/box/manifests/1: 401 Unauthorized","type":"Warning","reportingController":"kubelet","reportingInstance":"node-1"}
{"apiVersion":"v1","kind":"Event","metadata":{"name":"box.0","namespace":"team-a","uid":"e1","resourceVersion":"8"},"involvedObject":{"kind":"Pod","namespace":"team-a","name":"box"},"reason":"Scheduled","message":"Successfully assigned team-a/box to node-1","firstTimestamp":"2026-10-29T10:00:00Z","lastTimestamp":null,"eventTime":null,"type":"Normal","source":{"component":"default-scheduler"}}
`
	code, out, stderr := runEnrichCmd(t, in)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	occs := parseLines(t, out)
	if len(occs) != 2 || occs[0].EventID != "e1/8" || occs[1].EventID != "e2/9" {
		t.Fatalf("occurrences: %+v", occs)
	}
	f := occs[1]
	if f.OccurredAt != time.Date(2026, 10, 29, 10, 5, 0, 1000, time.UTC) || f.Attr != "pod_name" || f.Sandbox == nil ||
		f.Sandbox.Workspace != "team-a" || f.PullFailure == nil || f.PullFailure.Category != "unauthorized" || f.Image != "registry.local/box:1" {
		t.Fatalf("events.k8s.io occurrence: %+v %+v", f, f.PullFailure)
	}
}

func TestEnrichMalformed(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"syntax", `{"kind":"Pod"} {"kind": }`, "object 1 (syntax error at byte offset"},
		{"truncated", `{"kind":"List","items":[{"kind":"Pod"}`, "object 0 (starting at byte offset 0, truncated)"},
		{"not an object", `[1,2]`, "object 0 (byte offset 0): not a JSON object"},
		{"missing kind", `{"apiVersion":"v1"}`, "object 0 (byte offset 0): missing kind"},
		{"wrong type in a List item", `{"kind":"List","items":[{"kind":"Namespace","metadata":{"name":"a"}},{"apiVersion":"v1","kind":"Pod","metadata":"oops"}]}`, "object 0 (byte offset 0), kind List, item 1, kind Pod: json: cannot unmarshal"},
		{"bad time", `{"apiVersion":"v1","kind":"Event","metadata":{"name":"e"},"lastTimestamp":"yesterday"}`, `kind Event: time "yesterday"`},
		{"second object bad", `{"kind":"Namespace","metadata":{"name":"a"}}` + "\n" + `{"kind":"Event","count":"many"}`, "object 1 (byte offset 44), kind Event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, stderr := runEnrichCmd(t, tt.in)
			if code != 2 || out != "" || !strings.Contains(stderr, "malformed input on stdin") || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, out, stderr, tt.want)
			}
		})
	}
}

func TestEnrichFlags(t *testing.T) {
	if code, _, stderr := runEnrichCmd(t, "", "-o", "yaml"); code != 2 || !strings.Contains(stderr, "--output must be json or text") {
		t.Fatalf("bad output accepted: %d %s", code, stderr)
	}
	if code, _, _ := runEnrichCmd(t, "", "--no-such-flag"); code != 2 {
		t.Fatal("unknown flag accepted")
	}
	if code, _, stderr := runEnrichCmd(t, "", "--persistent-after", "0"); code != 2 || !strings.Contains(stderr, "persistent_after") {
		t.Fatalf("invalid config accepted: %d %s", code, stderr)
	}
	if code, _, _ := runEnrichCmd(t, "", "--help"); code != 0 {
		t.Fatal("--help is not success")
	}
	// Empty input: nothing to say, success.
	if code, out, _ := runEnrichCmd(t, ""); code != 0 || out != "" {
		t.Fatalf("empty input: %d %q", code, out)
	}
	// --persistent-after high: the demo's failures stay retrying.
	_, out, _ := runEnrichCmd(t, "", "--demo", "-o", "text", "--persistent-after", "100", "--max-message-bytes", "64")
	if !strings.Contains(out, "not_found (retrying, 7 failures)") {
		t.Fatalf("--persistent-after ignored:\n%s", out)
	}
}

// The embedded demo is the file in testdata.
func TestDemoEmbedded(t *testing.T) {
	b, err := os.ReadFile("testdata/demo.json")
	if err != nil || !bytes.Equal(b, demoScenario) {
		t.Fatalf("embedded demo differs from testdata/demo.json (%v)", err)
	}
}

// FuzzDecodeInput: any bytes either decode or fail with an error; a decoded
// snapshot always enriches and encodes.
func FuzzDecodeInput(f *testing.F) {
	f.Add(demoScenario)
	f.Add([]byte(`{"kind":"List","items":[{"kind":"List","items":[{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}]}]}`))
	f.Add([]byte(`{"apiVersion":"events.k8s.io/v1","kind":"Event","regarding":null,"series":{"count":-1}}`))
	f.Add([]byte("{\"kind\":\"Event\",\"apiVersion\":\"v1\",\"message\":\"\xff\"}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := decodeInput(bytes.NewReader(in))
		if err != nil {
			if s != nil {
				t.Fatal("snapshot and error")
			}
			return
		}
		e, err := newDemoEnricher(s)
		if err != nil {
			t.Fatal(err)
		}
		occs := enrichSnapshot(e, s)
		var buf bytes.Buffer
		if err := writeJSONLines(&buf, occs); err != nil {
			t.Fatalf("encode: %v", err)
		}
		if err := writeTable(&buf, occs); err != nil {
			t.Fatalf("table: %v", err)
		}
	})
}

// A dump of a sandbox whose pod the API server refused has no Event of it:
// the refusal is in the Sandbox's Ready condition, which `eventpipe enrich`
// reads as the agent does.
func TestEnrichReadyConditionRefusal(t *testing.T) {
	in := `{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"quota","namespace":"team-q","uid":"cr-q","resourceVersion":"41","annotations":{"openshell.ai/sandbox-id":"21111111-2222-4333-8444-555555555555","openshell.ai/sandbox-name":"quota","openshell.ai/sandbox-workspace":"team-q"}},"status":{"conditions":[{"type":"Ready","status":"False","reason":"ReconcilerError","message":"Error seen: pods \"quota\" is forbidden: exceeded quota: sandbox-pods, requested: pods=1, used: pods=0, limited: pods=0","lastTransitionTime":"2026-10-29T10:00:00Z"}]}}
{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","metadata":{"name":"fine","namespace":"team-q","uid":"cr-f","resourceVersion":"42","annotations":{"openshell.ai/sandbox-id":"31111111-2222-4333-8444-555555555555"}},"status":{"conditions":[{"type":"Ready","status":"True","reason":"DependenciesReady","message":"Pod is Ready","lastTransitionTime":"2026-10-29T10:00:00Z"}]}}
`
	code, out, stderr := runEnrichCmd(t, in)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(out, `"event_id":"sandbox-condition/cr-q/41"`) || !strings.Contains(out, `"kind":"create_refused"`) ||
		!strings.Contains(out, `"cause":"quota_exceeded"`) || !strings.Contains(out, `"object":"ResourceQuota/sandbox-pods"`) ||
		strings.Contains(out, "cr-f") || len(parseLines(t, out)) != 1 {
		t.Errorf("want one create_refused/quota_exceeded occurrence of sandbox quota:\n%s", out)
	}
}

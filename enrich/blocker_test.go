package enrich

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// blockerMessage is one entry of testdata/blockers/messages.json (see its
// README): a real Event or pod-status text with its public source and the
// diagnosis the source supports; kind "" for look-alikes.
type blockerMessage struct {
	Kind    string `json:"kind"`
	Cause   string `json:"cause"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Status  *struct {
		Waiting    string `json:"waiting"`
		Terminated string `json:"terminated"`
		ExitCode   *int32 `json:"exit_code"`
		Restarts   int32  `json:"restarts"`
		Init       bool   `json:"init"`
	} `json:"status"`
	Source string `json:"source"`
	Note   string `json:"note"`
	Split  string `json:"split"`
}

func loadBlockerCorpus(t testing.TB) []blockerMessage {
	t.Helper()
	b, err := os.ReadFile("testdata/blockers/messages.json")
	if err != nil {
		t.Fatalf("read corpus: %v", err)
	}
	var out []blockerMessage
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decode corpus: %v", err)
	}
	return out
}

// classifyEntry runs the classifier the way the enricher does: pod-status
// entries through ClassifyContainerStatus, the rest through ClassifyBlocker
// (after ClassifyPull, which wins when both would answer).
func classifyEntry(m blockerMessage) (kind, cause string, ok bool) {
	if s := m.Status; s != nil {
		var code int32
		if s.ExitCode != nil {
			code = *s.ExitCode
		}
		// The entry's reason and message are the waiting reason and
		// message when the status names no other waiting reason (the
		// enricher passes both).
		waiting, msg := s.Waiting, ""
		if m.Reason != "" && (waiting == "" || waiting == m.Reason) {
			waiting, msg = m.Reason, m.Message
		}
		cause, _, ok := ClassifyContainerStatus(waiting, msg, s.Terminated, code, s.ExitCode != nil)
		if !ok {
			return "", "", false
		}
		return eventpipev1.BlockerKindContainer, cause, true
	}
	if _, _, _, pull := ClassifyPull(m.Reason, m.Message); pull {
		return "", "", false
	}
	kind, cause, _, _, ok = ClassifyBlocker(m.Reason, m.Message)
	return kind, cause, ok
}

const none = "(none)"

type blockerTally struct{ n, right int }

func label(kind, cause string) string {
	if kind == "" {
		return none
	}
	return kind + "/" + cause
}

var blockerReport = flag.String("blockers.report", "", "write the held-out score and confusion matrix (markdown) to this file")

// blockersTrainOnly is for whoever writes rules: held-out entries are
// neither checked nor printed (no held-out miss, no floor), so no held-out
// text reaches the rule writer; make test runs without it.
var blockersTrainOnly = flag.Bool("blockers.train", false, "check the training entries only (for rule writers)")

// knownTrainMisses: training entries whose text cannot say what their
// source says (reported in bench/diagnosis/blockers.md), by source.
var knownTrainMisses = map[string]string{
	// Exit 137 with reason Error is a SIGKILL; the source knows it was the
	// OOM killer (a 1.1 runtime that did not report OOMKilled), the status
	// does not: a liveness kill looks the same.
	"https://github.com/kubernetes/kubernetes/issues/19825": "container/exit_error",
}

// heldOutFloor is the held-out score recorded in bench/diagnosis/blockers.md
// (session 6: 83/86 over the five draws' held-out entries after the rules
// for the fifth draw's training part; three of those answers are not
// independent, see there; 82/86 at that draw's first score): the test
// fails if a change makes it worse.
const heldOutFloor = 83.0 / 86

// TestBlockerCorpus: every training message gets exactly its kind and
// cause, no look-alike is diagnosed, and the held-out score (never looked at
// while writing rules) does not fall below the recorded figure.
func TestBlockerCorpus(t *testing.T) {
	msgs := loadBlockerCorpus(t)
	if len(msgs) < 100 {
		t.Fatalf("want at least 100 real messages, have %d", len(msgs))
	}
	perCause := map[string]*blockerTally{}
	confusion := map[[2]string]int{}
	var held, heldRight, lookalikes, lookalikesHit int
	for i, m := range msgs {
		if m.Source == "" || (m.Split != "train" && m.Split != "heldout") {
			t.Errorf("entry %d: source and split are required", i)
		}
		if m.Reason == "" && m.Status == nil {
			t.Errorf("entry %d: neither a reason nor a status", i)
		}
		kind, cause, ok := classifyEntry(m)
		got, want := none, label(m.Kind, m.Cause)
		if ok {
			got = label(kind, cause)
		}
		if *blockersTrainOnly && m.Split != "train" {
			continue
		}
		if m.Kind == "" {
			lookalikes++
			if ok {
				lookalikesHit++
				t.Errorf("entry %d (%s, %s): look-alike diagnosed as %s: %q", i, m.Split, m.Source, got, m.Message)
			}
			continue
		}
		switch m.Split {
		case "train":
			if got != want && knownTrainMisses[m.Source] != got {
				t.Errorf("entry %d (train, %s): %s, want %s: %q %q", i, m.Source, got, want, m.Reason, m.Message)
			}
		case "heldout":
			held++
			tl := perCause[want]
			if tl == nil {
				tl = &blockerTally{}
				perCause[want] = tl
			}
			tl.n++
			if got == want {
				heldRight++
				tl.right++
			} else {
				t.Logf("held-out miss %d (%s): %s, want %s: %q %q", i, m.Source, got, want, m.Reason, m.Message)
			}
			confusion[[2]string{want, got}]++
		}
	}
	score := float64(heldRight) / float64(max(held, 1))
	t.Logf("held-out: %d/%d right (%.1f%%); look-alikes diagnosed: %d/%d", heldRight, held, 100*score, lookalikesHit, lookalikes)
	if score < heldOutFloor && !*blockersTrainOnly {
		t.Errorf("held-out score %.3f fell below the recorded %.3f", score, heldOutFloor)
	}
	if *blockerReport != "" {
		writeBlockerReport(t, *blockerReport, perCause, confusion, held, heldRight, lookalikes, lookalikesHit, len(msgs))
	}
}

func writeBlockerReport(t *testing.T, path string, perCause map[string]*blockerTally, confusion map[[2]string]int, held, right, lookalikes, hit, total int) {
	var b strings.Builder
	fmt.Fprintf(&b, "Corpus: %d entries; held-out blockers: %d; look-alikes (both splits): %d.\n\n", total, held, lookalikes)
	fmt.Fprintf(&b, "Held-out: **%d/%d right (%.1f%%)**; look-alikes diagnosed: %d/%d.\n\n", right, held, 100*float64(right)/float64(max(held, 1)), hit, lookalikes)
	b.WriteString("| expected kind/cause | held-out | right | score |\n|---|---|---|---|\n")
	var keys []string
	for k := range perCause {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c := perCause[k]
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f%% |\n", k, c.n, c.right, 100*float64(c.right)/float64(c.n))
	}
	b.WriteString("\nConfusion (held-out; rows expected, columns answered; only non-zero cells):\n\n| expected | answered | n |\n|---|---|---|\n")
	var cells [][2]string
	for k := range confusion {
		cells = append(cells, k)
	}
	sort.Slice(cells, func(i, j int) bool {
		if cells[i][0] != cells[j][0] {
			return cells[i][0] < cells[j][0]
		}
		return cells[i][1] < cells[j][1]
	})
	for _, c := range cells {
		mark := ""
		if c[0] != c[1] {
			mark = " **miss**"
		}
		fmt.Fprintf(&b, "| %s | %s%s | %d |\n", c[0], c[1], mark, confusion[c])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every kind and cause the classifier answers, on the corpus and on the
// components' vocabulary, is a documented constant with a fix.
func TestBlockerValuesDocumented(t *testing.T) {
	kinds := map[string]bool{
		eventpipev1.BlockerKindUnschedulable: true, eventpipev1.BlockerKindVolume: true,
		eventpipev1.BlockerKindCreateRefused: true, eventpipev1.BlockerKindContainer: true,
	}
	msgs := loadBlockerCorpus(t)
	for _, e := range loadBlockerVocab(t) {
		m := blockerMessage{Reason: e.Reason, Message: e.Message}
		if e.Status != nil {
			if err := json.Unmarshal(e.Status, &m.Status); err != nil {
				t.Fatal(err)
			}
		}
		msgs = append(msgs, m)
	}
	for _, m := range msgs {
		kind, cause, ok := classifyEntry(m)
		if !ok {
			continue
		}
		if !kinds[kind] {
			t.Errorf("undocumented kind %q", kind)
		}
		b := &eventpipev1.Blocker{Kind: kind, Cause: cause, Object: "Secret/x", Container: "agent"}
		if fix := BlockerFix(b); fix == "" || strings.Contains(fix, "  ") {
			t.Errorf("%s/%s: fix %q", kind, cause, fix)
		}
		if !persistentBlocker(cause) && cause != eventpipev1.BlockerInsufficientResources && cause != eventpipev1.BlockerUnknown &&
			cause != eventpipev1.BlockerProvisioningFailed && cause != eventpipev1.BlockerAttachFailed &&
			cause != eventpipev1.BlockerMountTimeout && cause != eventpipev1.BlockerMountFailed &&
			cause != eventpipev1.BlockerWebhookFailed && cause != eventpipev1.BlockerNodesUnavailable {
			t.Errorf("cause %q is neither persistent nor listed as retrying", cause)
		}
	}
}

func FuzzClassifyBlocker(f *testing.F) {
	for _, m := range loadBlockerCorpus(f) {
		f.Add(m.Reason, m.Message)
	}
	for _, e := range loadBlockerVocab(f) {
		f.Add(e.Reason, e.Message)
	}
	f.Add("FailedScheduling", "0/3 nodes are available: 99999999999999999999 Insufficient cpu (")
	f.Add("FailedCreate", "exceeded quota: ")
	f.Fuzz(func(t *testing.T, reason, msg string) {
		kind, cause, object, detail, ok := ClassifyBlocker(reason, msg)
		if !ok {
			if kind != "" || cause != "" {
				t.Fatalf("not ok but %q %q", kind, cause)
			}
			return
		}
		if kind == "" || cause == "" {
			t.Fatalf("ok without kind or cause: %q %q", kind, cause)
		}
		if !utf8.ValidString(detail) || len(detail) > 512 {
			t.Fatalf("detail not clean: %q", detail)
		}
		_ = object
	})
}

// FuzzEnrichBlocker: any event with a blocker reason enriches to an
// occurrence that marshals (valid UTF-8 everywhere), carries at most one of
// pull_failure and blocker, and a blocker with kind, cause, object and a
// bounded fix.
func FuzzEnrichBlocker(f *testing.F) {
	for _, m := range loadBlockerCorpus(f) {
		f.Add(m.Reason, m.Message, "", int32(1))
	}
	for _, e := range loadBlockerVocab(f) {
		f.Add(e.Reason, e.Message, "", int32(1))
	}
	f.Add("FailedMount", "secret \"\xff\xfe\" not found", "spec.containers{agent}", int32(-3))
	f.Add("BackOff", "Back-off restarting failed container", "spec.containers{\xff}", int32(7))
	e := mustNew(f, NewDefaultConfig(), seedWorld().lookups())
	f.Fuzz(func(t *testing.T, reason, message, fieldPath string, count int32) {
		ev := podEvent("img-missing", fieldPath, reason, message)
		ev.Count = count
		o := e.Enrich(ev, t0).Occurrence
		if _, err := proto.Marshal(o); err != nil {
			t.Fatalf("proto: %v", err)
		}
		b := o.Blocker
		if b == nil {
			return
		}
		if o.PullFailure != nil {
			t.Fatal("both pull_failure and blocker")
		}
		if b.Kind == "" || b.Cause == "" || b.Object == "" || b.Fix == "" || len(b.Fix) > 4096 || len(b.Object) > maxFieldBytes {
			t.Fatalf("blocker %+v", b)
		}
	})
}

// A container the runtime could not start ends with the runtime's reason
// and code (Docker: ContainerCannotRun, -1 or 128; containerd: StartError,
// 128): that is start_failed, not the program's exit_error. Only the
// Docker form is in the corpus, so both are pinned here.
func TestContainerStatusRuntimeStartFailure(t *testing.T) {
	for _, tc := range []struct {
		terminated string
		code       int32
		cause      string
		detail     string
		ok         bool
	}{
		{"StartError", 128, eventpipev1.BlockerStartFailed, "StartError (exit code 128)", true},
		{"ContainerCannotRun", -1, eventpipev1.BlockerStartFailed, "ContainerCannotRun (exit code -1)", true},
		{"Error", 128, eventpipev1.BlockerExitError, "Error (exit code 128)", true},
		{"Completed", 0, "", "", false},
	} {
		cause, detail, ok := ClassifyContainerStatus("", "", tc.terminated, tc.code, true)
		if cause != tc.cause || detail != tc.detail || ok != tc.ok {
			t.Errorf("%s %d: got %q %q %v, want %q %q %v", tc.terminated, tc.code, cause, detail, ok, tc.cause, tc.detail, tc.ok)
		}
	}
}

// The wording families the fourth draw's rules cover, beyond the corpus's
// own messages: every form of kubelet's verifyRunAsNonRoot (Linux and
// Windows), the scheduler's volume binding plugin (a Lost claim in the
// pre-filter and per node, an ephemeral claim not created yet, a claim
// being deleted), PodTopologySpread with and without the missing-label
// suffix, PodSecurityPolicy admission with no policy, and a mount message
// cut after "not". The texts follow the components' format strings.
func TestBlockerWordingFamilies(t *testing.T) {
	const sched = "FailedScheduling"
	for _, tc := range []struct {
		reason, msg, kind, cause, object string
	}{
		{"Failed", `Error: container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root (pod: "web-1_ns(0f1e)", container: web)`, eventpipev1.BlockerKindContainer, eventpipev1.BlockerStartFailed, ""},
		{"CreateContainerConfigError", `container's runAsUser breaks non-root policy (pod: "web-1_ns(0f1e)", container: web)`, eventpipev1.BlockerKindContainer, eventpipev1.BlockerStartFailed, ""},
		{"CreateContainerConfigError", `container has runAsNonRoot and image has an invalid user id (-5). (Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive (pod: "web-1_ns(0f1e)", container: web)`, eventpipev1.BlockerKindContainer, eventpipev1.BlockerStartFailed, ""},
		{"Failed", `Error: container's runAsUser (ContainerAdministrator) which will be regarded as root identity and will break non-root policy (pod: "win-1_ns(0f1e)", container: app)`, eventpipev1.BlockerKindContainer, eventpipev1.BlockerStartFailed, ""},
		{sched, `0/3 nodes are available: 3 node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s). preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.`, eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerUnboundPVC, ""},
		{sched, `0/3 nodes are available: waiting for ephemeral volume controller to create the persistentvolumeclaim "web-1-scratch". preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.`, eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerUnboundPVC, ""},
		{sched, `0/3 nodes are available: persistentvolumeclaim "workspace-x" is being deleted. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.`, eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerUnboundPVC, ""},
		{sched, `0/6 nodes are available: 2 Insufficient cpu, 4 node(s) didn't match pod topology spread constraints (missing required label).`, eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerTopologySpread, ""},
		{sched, `0/6 nodes are available: 3 node(s) didn't match pod topology spread constraints, 3 node(s) didn't match pod anti-affinity rules.`, eventpipev1.BlockerKindUnschedulable, eventpipev1.BlockerTopologySpread, ""},
		{"FailedCreate", `Error creating: pods "sb-1-" is forbidden: PodSecurityPolicy: no providers available to validate pod request`, eventpipev1.BlockerKindCreateRefused, eventpipev1.BlockerPodSecurity, ""},
		{"FailedCreate", `Error creating: pods "sb-1-" is forbidden: no providers available to validate pod request`, eventpipev1.BlockerKindCreateRefused, eventpipev1.BlockerPodSecurity, ""},
		{"FailedMount", `MountVolume.SetUp failed for volume "tls" : secret "proxy-tls" not`, eventpipev1.BlockerKindVolume, eventpipev1.BlockerSecretNotFound, "Secret/proxy-tls"},
		// "not" must follow the named object at the very end: the Secret
		// named first is not the one the cut text is about.
		{"FailedMount", `MountVolume.SetUp failed for volume "cfg" : secret "a" is fine, configmap "b" not`, eventpipev1.BlockerKindVolume, eventpipev1.BlockerConfigMapNotFound, "ConfigMap/b"},
		{"FailedMount", `MountVolume.SetUp failed for volume "cfg" : configmap "b" not yet synced to the node`, eventpipev1.BlockerKindVolume, eventpipev1.BlockerMountFailed, ""},
	} {
		if _, _, _, pull := ClassifyPull(tc.reason, tc.msg); pull {
			t.Errorf("%q: taken as an image pull", tc.msg)
			continue
		}
		kind, cause, object, _, ok := ClassifyBlocker(tc.reason, tc.msg)
		if !ok || kind != tc.kind || cause != tc.cause || object != tc.object {
			t.Errorf("%s %q: got %s/%s %q (%v), want %s/%s %q", tc.reason, tc.msg, kind, cause, object, ok, tc.kind, tc.cause, tc.object)
		}
	}
}

// A status read without the exit code (Init:Error, then
// Init:CrashLoopBackOff) is a crash loop; with the code it stays the
// program's exit_error, and a terminated Error without back-off too.
func TestContainerStatusErrorWithoutCode(t *testing.T) {
	for _, tc := range []struct {
		waiting, terminated string
		code                int32
		has                 bool
		cause, detail       string
	}{
		{"CrashLoopBackOff", "Error", 0, false, eventpipev1.BlockerCrashLoop, "(last exit: Error)"},
		{"CrashLoopBackOff", "Error", 1, true, eventpipev1.BlockerExitError, "Error (exit code 1)"},
		{"", "Error", 0, false, eventpipev1.BlockerExitError, "Error"},
	} {
		cause, detail, ok := ClassifyContainerStatus(tc.waiting, "", tc.terminated, tc.code, tc.has)
		if !ok || cause != tc.cause || detail != tc.detail {
			t.Errorf("%+v: got %q %q %v", tc, cause, detail, ok)
		}
	}
}

// The fix names the field to change: topology spread (maxSkew, or the
// missing key), a Lost claim, kubelet's non-root refusal.
func TestBlockerFixFamilies(t *testing.T) {
	for _, tc := range []struct {
		b    *eventpipev1.Blocker
		want string
	}{
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerTopologySpread,
			Detail: "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints"}, "maxSkew"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerTopologySpread,
			Detail: "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints (missing required label)"}, "label the nodes"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerUnboundPVC,
			Detail: `0/4 nodes are available: persistentvolumeclaim "w" bound to non-existent persistentvolume "pv-1"`}, "no longer exists"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerUnboundPVC,
			Detail: "0/4 nodes are available: pod has unbound immediate PersistentVolumeClaims"}, "StorageClass, provisioner"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerStartFailed, Container: "agent",
			Detail: "container has runAsNonRoot and image will run as root"}, "runAsUser"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerStartFailed, Container: "agent",
			Detail: `exec: "/bin/agent": executable file not found in $PATH`}, "entrypoint"},
		// The families the components' vocabulary added: capacity other
		// than CPU and memory, pinned nodes, node pressure, a key missing
		// from a mounted object, quota forms, SCC and PSP, a namespace
		// being deleted, kubelet's subPath.
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerInsufficientResources,
			Detail: "0/3 nodes are available: 3 node(s) didn't have free ports for the requested pod ports"}, "hostPort"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerInsufficientResources,
			Detail: "0/3 nodes are available: 3 node(s) exceed max volume count"}, "attached volumes"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerInsufficientResources,
			Detail: "0/3 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 2 Insufficient cpu"}, "CPU, memory or GPU"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerNodeSelectorMismatch,
			Detail: "0/3 nodes are available: 3 node(s) didn't match the requested node name"}, "spec.nodeName"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerNodesUnavailable,
			Detail: "0/3 nodes are available: 3 node(s) had disk pressure"}, "pressure"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerKeyNotFound, Object: "Pod/sb-0",
			Detail: "MountVolume.SetUp failed for volume \"tls\" : references non-existent secret key: tls.crt"}, "volume's items"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerQuotaExceeded, Object: "ResourceQuota/compute",
			Detail: "pods \"sb-0\" is forbidden: failed quota: compute: must specify limits.cpu for: agent"}, "LimitRange with defaults"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerQuotaExceeded, Object: "ResourceQuota/compute",
			Detail: "pods \"sb-0\" is forbidden: status unknown for quota: compute, resources: requests.cpu"}, "quota controller"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerPodSecurity,
			Detail: "pods \"sb-0\" is forbidden: unable to validate against any security context constraint: []"}, "add-scc-to-user"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerPodSecurity,
			Detail: "pods \"sb-0\" is forbidden: PodSecurityPolicy: no providers available to validate pod request"}, "PodSecurityPolicy"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerNamespaceTerminating, Object: "Namespace/openshell",
			Detail: "unable to create new content in namespace openshell because it is being terminated"}, "namespace openshell is being deleted"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerMountFailed, Container: "agent",
			Detail: `failed to prepare subPath for volumeMount "workspace" of container "agent"`}, "subPath"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerUnboundPVC,
			Detail: `Cannot bind to requested volume "pv-1": requested PV is too small`}, "volumeName"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerMountFailed,
			Detail: `MountVolume.SetUp failed for volume "tls" : failed to sync secret cache: timed out waiting for the condition`}, "API server"},
		{&eventpipev1.Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerStartFailed, Container: "agent",
			Detail: "FailedPostStartHook: PostStartHook failed"}, "hook's command"},
	} {
		if fix := BlockerFix(tc.b); !strings.Contains(fix, tc.want) {
			t.Errorf("%s/%s %q: fix %q lacks %q", tc.b.Kind, tc.b.Cause, tc.b.Detail, fix, tc.want)
		}
	}
}

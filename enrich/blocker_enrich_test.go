package enrich

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// An unschedulable sandbox pod: the occurrence carries the blocker with the
// pod as object, no container, the scheduler's summary as detail; a taint
// no node tolerates turns persistent at the third failure of the same
// Event (count bumps), while missing capacity stays retrying.
func TestEnrichBlockerUnschedulable(t *testing.T) {
	const taint = "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := podEvent("img-missing", "", "FailedScheduling", taint)
	ev.Type, ev.ReportingComponent, ev.ReportingInstance = "Warning", "default-scheduler", ""
	var b *eventpipev1.Blocker
	for n := int32(1); n <= 3; n++ {
		ev.Count, ev.ResourceVersion = n, string(rune('0'+n))
		ev.LastTimestamp = t0.Add(time.Duration(n) * 30 * time.Second)
		o := e.Enrich(ev, ev.LastTimestamp).Occurrence
		if o.GetSandbox().GetId() != seedID || o.PullFailure != nil {
			t.Fatalf("attribution %+v, pull %+v", o.GetSandbox(), o.PullFailure)
		}
		b = o.Blocker
		if b == nil {
			t.Fatal("no blocker")
		}
		want := eventpipev1.DispositionRetrying
		if n == 3 {
			want = eventpipev1.DispositionPersistent
		}
		if b.Disposition != want || b.Attempts != uint32(n) {
			t.Errorf("count %d: disposition %s attempts %d, want %s %d", n, b.Disposition, b.Attempts, want, n)
		}
	}
	if b.Kind != eventpipev1.BlockerKindUnschedulable || b.Cause != eventpipev1.BlockerUntoleratedTaint ||
		b.Object != "Pod/img-missing" || b.Container != "" || b.Source != eventpipev1.PullSourceEvent {
		t.Errorf("blocker %+v", b)
	}
	if strings.Contains(b.Detail, "preemption") || !strings.Contains(b.Fix, "{nvidia.com/gpu: present}") {
		t.Errorf("detail %q fix %q", b.Detail, b.Fix)
	}
	if !b.FirstSeen.AsTime().Equal(t0) || !b.LastSeen.AsTime().Equal(t0.Add(90*time.Second)) {
		t.Errorf("first %v last %v", b.FirstSeen.AsTime(), b.LastSeen.AsTime())
	}

	cap := podEvent(seedSupPod, "", "FailedScheduling", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.")
	cap.Count = 9
	o := e.Enrich(cap, t0).Occurrence
	if o.Blocker.GetCause() != eventpipev1.BlockerInsufficientResources || o.Blocker.GetDisposition() != eventpipev1.DispositionRetrying || o.Blocker.GetAttempts() != 9 {
		t.Errorf("capacity: %+v", o.Blocker)
	}
}

// The workspace PVC without a StorageClass: attributed to the sandbox by the
// PVC rule, the claim as object, a fix that names it.
func TestEnrichBlockerUnboundPVC(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := &Event{APIVersion: "v1", Namespace: seedNS, Name: "workspace-img-missing.1", UID: "ev-pvc", ResourceVersion: "9",
		Involved: ObjectRef{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: seedNS, Name: "workspace-img-missing", UID: "pvc-uid"},
		Type:     "Normal", Reason: "FailedBinding", Message: "no persistent volumes available for this claim and no storage class is set",
		Count: 4, FirstTimestamp: t0, LastTimestamp: t0.Add(2 * time.Minute), ReportingComponent: "persistentvolume-controller"}
	o := e.Enrich(ev, t0).Occurrence
	b := o.Blocker
	if o.GetSandbox().GetId() != seedID || b == nil {
		t.Fatalf("sandbox %+v blocker %+v", o.GetSandbox(), b)
	}
	if b.Kind != eventpipev1.BlockerKindVolume || b.Cause != eventpipev1.BlockerNoStorageClass || b.Object != "PersistentVolumeClaim/workspace-img-missing" ||
		b.Disposition != eventpipev1.DispositionPersistent || !strings.Contains(b.Fix, "workspace-img-missing") {
		t.Errorf("blocker %+v", b)
	}
	// The missing proxy-auth secret names the Secret.
	mount := podEvent("img-missing", "", "FailedMount", `MountVolume.SetUp failed for volume "proxy-auth" : secret "openshell-proxy-auth" not found`)
	if b := e.Enrich(mount, t0).Occurrence.Blocker; b.GetCause() != eventpipev1.BlockerSecretNotFound || b.GetObject() != "Secret/openshell-proxy-auth" ||
		!strings.Contains(b.GetFix(), "openshell-proxy-auth") {
		t.Errorf("mount: %+v", b)
	}
}

// A crash loop seen both ways: the pod status (CrashLoopBackOff, last
// terminated OOMKilled, restart count) and kubelet's BackOff events, which
// name no cause and inherit oom_killed; persistent once restarts reach the
// threshold.
func TestEnrichBlockerCrashLoop(t *testing.T) {
	m := seedWorld()
	p := seedPod()
	p.Phase = "Running"
	for i := range p.Containers {
		p.Containers[i].WaitingReason, p.Containers[i].WaitingMessage = "", ""
	}
	agent := &p.Containers[4]
	agent.WaitingReason = "CrashLoopBackOff"
	agent.WaitingMessage = "back-off 20s restarting failed container=agent pod=img-missing_" + seedNS + "(" + seedPodUID + ")"
	agent.TerminatedReason, agent.TerminatedExitCode, agent.RestartCount = "OOMKilled", 137, 2
	m.addPod(p)
	e := mustNew(t, NewDefaultConfig(), m.lookups())

	out := e.DiagnosePod(p, t0)
	if len(out) != 1 {
		t.Fatalf("%d occurrences, want 1", len(out))
	}
	o := out[0]
	b := o.Blocker
	if o.PullFailure != nil || b == nil || o.Container != "agent" || o.GetSandbox().GetId() != seedID {
		t.Fatalf("occurrence %+v", o)
	}
	if b.Kind != eventpipev1.BlockerKindContainer || b.Cause != eventpipev1.BlockerOOMKilled || b.Container != "agent" ||
		b.Source != eventpipev1.PullSourcePodStatus || !b.HasExitCode || b.ExitCode != 137 || b.Attempts != 2 ||
		b.Disposition != eventpipev1.DispositionRetrying || o.EventId != seedPodUID+"/5302/agent" {
		t.Errorf("status blocker %+v (event id %s)", b, o.EventId)
	}
	ev := podEvent("img-missing", "spec.containers{agent}", "BackOff", "Back-off restarting failed container agent in pod img-missing_"+seedNS+"("+seedPodUID+")")
	ev.Type, ev.Count, ev.LastTimestamp = "Warning", 3, t0.Add(2*time.Minute)
	eb := e.Enrich(ev, t0.Add(time.Minute)).Occurrence.Blocker
	if eb.GetCause() != eventpipev1.BlockerOOMKilled || eb.GetContainer() != "agent" || eb.GetAttempts() != 3 ||
		eb.GetDisposition() != eventpipev1.DispositionPersistent || !strings.Contains(eb.GetFix(), "memory limit") {
		t.Errorf("event blocker %+v", eb)
	}

	// The other order: kubelet's BackOff first (no cause: crash_loop), then
	// the pod status refines it to oom_killed and keeps the count.
	e = mustNew(t, NewDefaultConfig(), m.lookups())
	if b := e.Enrich(ev, t0).Occurrence.Blocker; b.GetCause() != eventpipev1.BlockerCrashLoop || b.GetAttempts() != 3 {
		t.Errorf("back-off alone: %+v", b)
	}
	if b := e.DiagnosePod(p, t0.Add(3*time.Minute))[0].Blocker; b.GetCause() != eventpipev1.BlockerOOMKilled || b.GetAttempts() != 3 ||
		b.GetDisposition() != eventpipev1.DispositionPersistent {
		t.Errorf("refined by the status: %+v", b)
	}
}

// An init container that cannot read its Secret (CreateContainerConfigError
// in the pod status; kubelet's Failed "Error: secret ... not found").
func TestEnrichBlockerContainerConfig(t *testing.T) {
	m := seedWorld()
	p := seedPod()
	ws := &p.Containers[3]
	ws.WaitingReason, ws.WaitingMessage = "CreateContainerConfigError", `secret "openshell-tls" not found`
	m.addPod(p)
	e := mustNew(t, NewDefaultConfig(), m.lookups())
	out := e.DiagnosePod(p, t0)
	if len(out) != 1 || out[0].Blocker.GetCause() != eventpipev1.BlockerSecretNotFound || out[0].Blocker.GetObject() != "Secret/openshell-tls" ||
		out[0].Blocker.GetContainer() != "workspace-init" || out[0].Blocker.GetKind() != eventpipev1.BlockerKindContainer {
		t.Fatalf("%+v", out)
	}
}

// Pull failures stay pull failures (never blockers too), and the events of
// a healthy start carry no blocker.
func TestEnrichBlockerNotForPullsOrNormalEvents(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	for _, ev := range []*Event{
		podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", seedFailed),
		podEvent("img-missing", "spec.initContainers{workspace-init}", "Failed", "Error: ErrImagePull"),
		podEvent("img-missing", "spec.initContainers{workspace-init}", "BackOff", seedBackOff),
	} {
		o := e.Enrich(ev, t0).Occurrence
		if o.PullFailure == nil || o.Blocker != nil {
			t.Errorf("%s %q: pull %v blocker %v", ev.Reason, ev.Message, o.PullFailure != nil, o.Blocker)
		}
	}
	for _, m := range loadBlockerCorpus(t) {
		if m.Kind != "" || m.Status != nil {
			continue
		}
		if o := e.Enrich(podEvent("img-missing", "", m.Reason, m.Message), t0).Occurrence; o.Blocker != nil {
			t.Errorf("look-alike %s %q: blocker %+v", m.Reason, m.Message, o.Blocker)
		}
	}
}

// FailedCreate on the Sandbox CR: quota exceeded names the ResourceQuota.
func TestEnrichBlockerCreateRefused(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := &Event{APIVersion: "events.k8s.io/v1", Namespace: seedNS, UID: "ev-cr", ResourceVersion: "2",
		Involved: ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Namespace: seedNS, Name: "img-missing", UID: seedCRUID},
		Type:     "Warning", Reason: "FailedCreate", EventTime: t0,
		Message: `pods "img-missing" is forbidden: exceeded quota: sandbox-quota, requested: requests.memory=8Gi, used: requests.memory=60Gi, limited: requests.memory=64Gi`}
	o := e.Enrich(ev, t0).Occurrence
	b := o.Blocker
	if o.GetSandbox().GetId() != seedID || b.GetKind() != eventpipev1.BlockerKindCreateRefused || b.GetCause() != eventpipev1.BlockerQuotaExceeded ||
		b.GetObject() != "ResourceQuota/sandbox-quota" || !strings.Contains(b.GetFix(), "ResourceQuota/sandbox-quota") {
		t.Errorf("%+v %+v", o.GetSandbox(), b)
	}
}

// Hostile input: bounded, valid UTF-8, no panic.
func TestEnrichBlockerHostileMessage(t *testing.T) {
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	msg := `MountVolume.SetUp failed for volume "x" : secret "` + strings.Repeat("\xff", 40<<10) + `" not found`
	b := e.Enrich(podEvent("img-missing", "", "FailedMount", msg), t0).Occurrence.Blocker
	if b == nil || len(b.Detail) > 512 || len(b.Object) > 4096 {
		t.Fatalf("blocker %+v", b)
	}
	for _, s := range []string{b.Detail, b.Object, b.Fix} {
		if !utf8.ValidString(s) {
			t.Errorf("invalid UTF-8 in %q", s[:min(len(s), 40)])
		}
	}
}

// The blocker check on ordinary events: a reason switch, nothing else.
func BenchmarkClassifyBlockerOrdinary(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, _, _, ok := ClassifyBlocker("Started", "Started container agent"); ok {
			b.Fatal("blocker")
		}
	}
}

func BenchmarkClassifyBlockerScheduling(b *testing.B) {
	const msg = "0/14 nodes are available: 11 node(s) didn't match Pod's node affinity/selector, 3 node(s) were unschedulable. preemption: 0/14 nodes are available: 14 Preemption is not helpful for scheduling."
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, _, _, ok := ClassifyBlocker("FailedScheduling", msg); !ok {
			b.Fatal("not a blocker")
		}
	}
}

package kafka

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// The corpora of enrich/testdata (real kubelet, scheduler, volume and
// controller texts, image-pull failures and their look-alikes, blockers and
// pod-status diagnoses), turned into occurrences by the real enricher over
// one OpenShell sandbox, so the OCSF output is validated on what the agent
// really ships.

const (
	corpusNS      = "openshell-openshell-repro"
	corpusSandbox = "2ff21e26-1a7b-49a2-a640-14ae153f93ea"
	corpusPodUID  = "876414ec-8379-42b9-8deb-a047f4214891"
	corpusCRUID   = "5b1f0a52-3c0e-4d7e-9a51-1f0e2d3c4b5a"
	corpusPVCUID  = "9d2c7e11-6a4b-4f3e-8c21-7e6d5c4b3a29"
	corpusNode    = "worker-1"
	corpusImage   = "ghcr.io/nvidia/openshell/sandbox-base@sha256:6d3c5c1f4f0e7b0a3b2e9f8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e"
)

type corpusLookups struct {
	pod *enrich.Pod
	sb  *enrich.Sandbox
	ns  *enrich.Namespace
	pvc *enrich.PVC
}

func (l *corpusLookups) Pod(ns, name string) (*enrich.Pod, bool) {
	return l.pod, ns == corpusNS && name == l.pod.Name
}
func (l *corpusLookups) PVC(ns, name string) (*enrich.PVC, bool) {
	return l.pvc, ns == corpusNS && name == l.pvc.Name
}
func (l *corpusLookups) Sandbox(ns, name string) (*enrich.Sandbox, bool) {
	return l.sb, ns == corpusNS && name == l.sb.Name
}
func (l *corpusLookups) SandboxByUID(uid string) (*enrich.Sandbox, bool) {
	return l.sb, uid == l.sb.UID
}
func (l *corpusLookups) Namespace(name string) (*enrich.Namespace, bool) {
	return l.ns, name == corpusNS
}

type corpusEntry struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Status  *struct {
		Waiting    string `json:"waiting"`
		Terminated string `json:"terminated"`
		ExitCode   *int32 `json:"exit_code"`
		Restarts   int32  `json:"restarts"`
	} `json:"status"`
}

func readCorpus(t testing.TB, name string) []corpusEntry {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "enrich", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var out []corpusEntry
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// corpusOccurrences plays every entry of the corpora three times (so
// retried causes turn persistent) and returns what the enricher made of
// them, plus an event about an object of no sandbox.
func corpusOccurrences(t testing.TB) []*eventpipev1.Occurrence {
	t.Helper()
	ids := enrich.PairsOf(map[string]string{"openshell.ai/sandbox-id": corpusSandbox, "openshell.ai/sandbox-name": "img-missing",
		"openshell.ai/sandbox-workspace": "repro"})
	owner := []enrich.Owner{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: "img-missing", UID: corpusCRUID, Controller: true}}
	lk := &corpusLookups{
		ns: &enrich.Namespace{Meta: enrich.Meta{Name: corpusNS, UID: "ns-1", Labels: enrich.PairsOf(map[string]string{
			"openshell.ai/managed-by": "openshell", "openshell.ai/gateway-id": "openshell", "openshell.ai/sandbox-workspace": "repro"})}},
		sb: &enrich.Sandbox{APIVersion: "agents.x-k8s.io/v1beta1", PodName: "img-missing",
			Meta: enrich.Meta{Namespace: corpusNS, Name: "img-missing", UID: corpusCRUID, Annotations: ids,
				Labels: enrich.PairsOf(map[string]string{"openshell.ai/managed-by": "openshell", "openshell.ai/sandbox-id": corpusSandbox})}},
		pod: &enrich.Pod{NodeName: corpusNode, Phase: "Pending",
			Meta: enrich.Meta{Namespace: corpusNS, Name: "img-missing", UID: corpusPodUID, Owners: owner,
				Annotations: enrich.PairsOf(map[string]string{"openshell.ai/sandbox-id": corpusSandbox})},
			Containers: []enrich.Container{{Name: "workspace-init", Image: corpusImage, Init: true}, {Name: "agent", Image: corpusImage}}},
		pvc: &enrich.PVC{Meta: enrich.Meta{Namespace: corpusNS, Name: "workspace-img-missing", UID: corpusPVCUID, Owners: owner}},
	}
	cfg := enrich.NewDefaultConfig()
	cfg.Cluster = "kind-osrepro"
	en, err := enrich.New(cfg, enrich.Lookups{Pods: lk, PVCs: lk, Namespaces: lk, Sandboxes: lk})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	var out []*eventpipev1.Occurrence
	seq := 0
	event := func(ref enrich.ObjectRef, component, instance string, e corpusEntry, count int32) {
		seq++
		now = now.Add(time.Second)
		typ := "Warning"
		switch e.Reason {
		case "Scheduled", "Pulling", "Pulled", "pulled", "Created", "Started", "SuccessfulAttachVolume", "SuccessfulCreate",
			"SuccessfulMountVolume", "ProvisioningSucceeded", "Provisioning", "ExternalProvisioning", "WaitForFirstConsumer",
			"TriggeredScaleUp", "SandboxChanged", "Killing":
			typ = "Normal"
		}
		ref.Namespace = corpusNS
		ev := &enrich.Event{APIVersion: "v1", Namespace: corpusNS, Name: fmt.Sprintf("%s.%x", ref.Name, seq),
			UID: fmt.Sprintf("7f1c2d3e-0000-4000-8000-%012d", seq), ResourceVersion: fmt.Sprint(1000 + seq),
			Involved: ref, Type: typ, Reason: e.Reason, Message: e.Message, Count: count,
			FirstTimestamp: now.Add(-time.Duration(count) * 10 * time.Second), LastTimestamp: now,
			ReportingComponent: component, ReportingInstance: instance}
		out = append(out, en.Enrich(ev, now).Occurrence)
	}
	pod := enrich.ObjectRef{Kind: "Pod", APIVersion: "v1", Name: "img-missing", UID: corpusPodUID}
	agent := pod
	agent.FieldPath = "spec.containers{agent}"
	play := func(e corpusEntry, round int32) {
		switch e.Reason {
		case "FailedScheduling", "Scheduled":
			event(pod, "default-scheduler", "", e, round)
		case "TriggeredScaleUp":
			event(pod, "cluster-autoscaler", "", e, round)
		case "ProvisioningFailed", "FailedBinding", "ExternalProvisioning", "Provisioning", "ProvisioningSucceeded", "WaitForFirstConsumer":
			event(enrich.ObjectRef{Kind: "PersistentVolumeClaim", APIVersion: "v1", Name: "workspace-img-missing", UID: corpusPVCUID},
				"persistentvolume-controller", "", e, round)
		case "FailedCreate", "SuccessfulCreate":
			event(enrich.ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Name: "img-missing", UID: corpusCRUID},
				"sandbox-controller", "", e, round)
		case "FailedAttachVolume", "SuccessfulAttachVolume":
			event(pod, "attachdetach-controller", "", e, round)
		case "FailedMount", "SuccessfulMountVolume", "FailedCreatePodSandBox", "SandboxChanged", "FailedSync", "FreeDiskSpaceFailed":
			event(pod, "kubelet", corpusNode, e, round)
		default:
			event(agent, "kubelet", corpusNode, e, round)
		}
	}
	for _, name := range []string{"pull_messages.json", "not_pull_messages.json", "blockers/messages.json"} {
		for _, e := range readCorpus(t, name) {
			for round := int32(1); round <= 3; round++ {
				if s := e.Status; s != nil {
					// A pod-status entry: the agent's diagnosis of the
					// container's status.
					now = now.Add(time.Minute)
					p := *lk.pod
					p.ResourceVersion = fmt.Sprint(5000 + seq)
					seq++
					p.Containers = append([]enrich.Container(nil), p.Containers...)
					c := &p.Containers[1]
					c.WaitingReason, c.WaitingMessage, c.TerminatedReason = s.Waiting, e.Message, s.Terminated
					if s.ExitCode != nil {
						c.TerminatedExitCode = *s.ExitCode
					}
					c.RestartCount = s.Restarts + round
					out = append(out, en.DiagnosePod(&p, now)...)
					continue
				}
				play(e, round)
			}
		}
	}
	// An event about an object of no sandbox.
	seq++
	out = append(out, en.Enrich(&enrich.Event{APIVersion: "v1", Namespace: "kube-system", Name: "worker-1.1", UID: "ev-node",
		ResourceVersion: "77", Involved: enrich.ObjectRef{Kind: "Node", APIVersion: "v1", Name: corpusNode, UID: "node-uid-1"},
		Type: "Warning", Reason: "NodeNotReady", Message: "Node worker-1 status is now: NodeNotReady", Count: 1,
		LastTimestamp: now, ReportingComponent: "node-controller"}, now).Occurrence)
	return out
}

// TestOCSFValidAgainstTheSchema: every record the corpora produce is a
// valid OCSF 1.8.0 Application Lifecycle event by the official schema files
// (testdata/ocsf-schema). On the encoder before this test existed all 1,270
// records failed: container is no attribute of the class (1,269), the
// container profile declared where neither the class nor an object of the
// event includes it (1,270), container.image without its required uid
// (483), "Other" as the name of activity 99 (172).
func TestOCSFValidAgainstTheSchema(t *testing.T) {
	s, class := ocsfClass(t)
	occs := corpusOccurrences(t)
	invalid, byProblem := 0, map[string]int{}
	var first []string
	var withDevice, withImage, other, blockers, high int
	for _, o := range occs {
		b, err := AppendOCSF(nil, o)
		if err != nil {
			t.Fatal(err)
		}
		if ev := OCSF(o); ev.Device != nil {
			withDevice++
			if ev.Device.Container.Image != nil {
				withImage++
			}
		}
		if OCSF(o).ActivityID == OCSFActivityOther {
			other++
		}
		if o.GetBlocker() != nil {
			blockers++
		}
		if OCSF(o).SeverityID == OCSFSeverityHigh {
			high++
		}
		errs := s.validate(class, decodeNumbers(t, b).(map[string]any))
		if len(errs) == 0 {
			continue
		}
		invalid++
		for _, e := range errs {
			byProblem[e]++
		}
		if len(first) < 1 {
			first = append(first, fmt.Sprintf("%s\n  %v", b, errs))
		}
	}
	if invalid > 0 {
		for p, n := range byProblem {
			t.Errorf("%d records: %s", n, p)
		}
		t.Errorf("%d of %d records invalid; first:\n%s", invalid, len(occs), first)
	}
	t.Logf("%d of %d records valid: %d with a device and container, %d of them with an image object, %d of activity Other, %d with a blocker, %d of severity High",
		len(occs)-invalid, len(occs), withDevice, withImage, other, blockers, high)
	if withDevice == 0 || withImage == 0 || other == 0 || blockers == 0 || high == 0 {
		t.Errorf("the corpora no longer exercise every part of the mapping")
	}
}

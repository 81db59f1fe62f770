package enrich

import (
	"strings"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
)

// TestProbeBlocker: a probe failure is transient until it failed as often
// as the kubelet's default failureThreshold (3) within the window; then it
// is a probe blocker naming the probe, with the runtime's words, and
// persistent once it lasted blockerMinAge (the reports come every
// periodSeconds, 10 s by default). Only a sandbox's pods are tracked.
// The wordings are the kubelet's (pkg/kubelet/prober/prober.go "%s probe
// failed: %s" and "%s probe errored: %v"; kuberuntime_manager.go
// "Container %s failed %s probe, will be restarted", before 1.16
// "Killing container with id docker://%s:Container failed liveness
// probe.. Container will be killed and recreated.").
func TestProbeBlocker(t *testing.T) {
	tests := []struct {
		name, reason, msg string
		cause             string
	}{
		{"readiness", "Unhealthy", `Readiness probe failed: Get "http://10.244.0.7:8080/healthz": dial tcp 10.244.0.7:8080: connect: connection refused`, eventpipev1.BlockerReadinessProbe},
		{"liveness by status code", "Unhealthy", "Liveness probe failed: HTTP probe failed with statuscode: 503", eventpipev1.BlockerLivenessProbe},
		{"a probe that cannot run", "Unhealthy", `Liveness probe errored: rpc error: code = Unknown desc = failed to exec in container: starting container process caused: exec: "invalid": executable file not found in $PATH: unknown`, eventpipev1.BlockerLivenessProbe},
		{"startup", "Unhealthy", "Startup probe failed: cat: can't open '/tmp/started': No such file or directory", eventpipev1.BlockerStartupProbe},
		{"the kubelet restarts it", "Killing", "Container agent failed liveness probe, will be restarted", eventpipev1.BlockerLivenessProbe},
		{"before 1.16", "Killing", "Killing container with id docker://agent:Container failed liveness probe.. Container will be killed and recreated.", eventpipev1.BlockerLivenessProbe},
		{"Kubernetes 1.0's spelling", "unhealthy", "Liveness probe failed: Get http://10.0.0.7:8080/healthz: dial tcp 10.0.0.7:8080: connection refused", eventpipev1.BlockerLivenessProbe},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
			ev := podEvent("img-missing", "spec.containers{agent}", tt.reason, tt.msg)
			ev.Type = "Warning"
			for n, want := range []struct {
				blocker bool
				disp    string
			}{{false, ""}, {false, ""}, {true, eventpipev1.DispositionRetrying}, {true, eventpipev1.DispositionPersistent}} {
				ev.Count = int32(n + 1)
				ev.LastTimestamp = t0.Add(time.Duration(n) * 10 * time.Second)
				ev.ResourceVersion = string(rune('1' + n))
				b := e.Enrich(ev, ev.LastTimestamp).Occurrence.GetBlocker()
				if (b != nil) != want.blocker {
					t.Fatalf("failure %d: blocker %+v, want one: %v", n+1, b, want.blocker)
				}
				if b == nil {
					continue
				}
				if b.GetKind() != eventpipev1.BlockerKindContainer || b.GetCause() != tt.cause || b.GetContainer() != "agent" ||
					b.GetDetail() != blockerDetail(tt.msg) || b.GetDisposition() != want.disp || b.GetAttempts() != uint32(n+1) ||
					!strings.Contains(b.GetFix(), "probe of container agent") || b.GetConfidence() != eventpipev1.ConfidenceCertain {
					t.Errorf("failure %d: %+v", n+1, b)
				}
			}
		})
	}
	// Not a sandbox's pod: never tracked, never a blocker.
	e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
	ev := podEvent("coredns-7db6d8ff4d-x", "spec.containers{coredns}", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 503")
	ev.Count = 10
	if b := e.Enrich(ev, t0).Occurrence.GetBlocker(); b != nil || e.blocks.len() != 0 {
		t.Errorf("another pod's probe: blocker %+v, %d tracked", b, e.blocks.len())
	}
}

// TestProvisionerWaiting: ExternalProvisioning is normal progress until
// the claim has waited provisionerWait (5 minutes, first to last event);
// then it is a persistent provisioner_waiting blocker naming the
// provisioner. The wordings are the PV controller's (1.1x-1.2x and 1.3x).
func TestProvisionerWaiting(t *testing.T) {
	for _, msg := range []string{
		`waiting for a volume to be created, either by external provisioner "ebs.csi.aws.com" or manually created by system administrator`,
		`Waiting for a volume to be created either by the external provisioner 'ebs.csi.aws.com' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.`,
	} {
		e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
		ev := &Event{APIVersion: "v1", Namespace: seedNS, Name: "workspace-img-missing.2", UID: "ev-prov", ResourceVersion: "1",
			Involved: ObjectRef{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: seedNS, Name: "workspace-img-missing", UID: "pvc-uid"},
			Type:     "Normal", Reason: "ExternalProvisioning", Message: msg, Count: 1, FirstTimestamp: t0, LastTimestamp: t0,
			ReportingComponent: "persistentvolume-controller"}
		for _, wait := range []time.Duration{0, 15 * time.Second, 4 * time.Minute} {
			ev.LastTimestamp, ev.Count = t0.Add(wait), ev.Count+1
			if b := e.Enrich(ev, ev.LastTimestamp).Occurrence.GetBlocker(); b != nil {
				t.Fatalf("after %s: blocker %+v, want none yet", wait, b)
			}
		}
		ev.LastTimestamp, ev.Count = t0.Add(provisionerWait), ev.Count+1
		o := e.Enrich(ev, ev.LastTimestamp).Occurrence
		b := o.GetBlocker()
		if o.GetSandbox().GetId() != seedID || b.GetKind() != eventpipev1.BlockerKindVolume || b.GetCause() != eventpipev1.BlockerProvisionerWaiting ||
			b.GetObject() != "StorageClassProvisioner/ebs.csi.aws.com" || b.GetDisposition() != eventpipev1.DispositionPersistent ||
			!strings.Contains(b.GetFix(), "provisioner ebs.csi.aws.com") {
			t.Errorf("after %s: %+v", provisionerWait, b)
		}
	}
}

// TestBlockerPersistenceNeedsTime: three reports of a cause retrying cannot
// fix, all within a second (the scheduler and the PV controller retry at
// once when the cluster changes), are not persistent; the same count over
// blockerMinAge is. Before issue 24 the count alone decided, and a claim
// bound a second later had been called persistent.
func TestBlockerPersistenceNeedsTime(t *testing.T) {
	for _, tc := range []struct {
		span time.Duration
		want string
	}{
		{800 * time.Millisecond, eventpipev1.DispositionRetrying},
		{blockerMinAge, eventpipev1.DispositionPersistent},
	} {
		e := mustNew(t, NewDefaultConfig(), seedWorld().lookups())
		ev := podEvent("img-missing", "", "FailedScheduling", "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
		ev.Type, ev.Count, ev.FirstTimestamp, ev.LastTimestamp = "Warning", 3, t0, t0.Add(tc.span)
		b := e.Enrich(ev, ev.LastTimestamp).Occurrence.GetBlocker()
		if b.GetCause() != eventpipev1.BlockerUnboundPVC || b.GetAttempts() != 3 || b.GetDisposition() != tc.want {
			t.Errorf("3 reports over %s: %s %d %s, want unbound_pvc 3 %s", tc.span, b.GetCause(), b.GetAttempts(), b.GetDisposition(), tc.want)
		}
	}
}

// TestNotTriggerScaleUpAndOldSpellings: the cluster autoscaler's refusal
// to add a node, and Kubernetes 1.0's lower-case reasons, are read like
// today's FailedScheduling.
func TestNotTriggerScaleUpAndOldSpellings(t *testing.T) {
	tests := []struct{ reason, msg, cause string }{
		{"NotTriggerScaleUp", "pod didn't trigger scale-up: 2 max node group size reached", eventpipev1.BlockerInsufficientResources},
		{"NotTriggerScaleUp", "pod didn't trigger scale-up: 1 node(s) had untolerated taint {sku: gpu}, 3 node(s) didn't match Pod's node affinity/selector", eventpipev1.BlockerNodeSelectorMismatch},
		{"NotTriggerScaleUp", "pod didn't trigger scale-up:", eventpipev1.BlockerUnknown},
		{"failedScheduling", "Failed for reason PodFitsResources and possibly others", eventpipev1.BlockerInsufficientResources},
		{"failedMount", `MountVolume.SetUp failed for volume "proxy-auth" : secrets "openshell-proxy-auth" not found`, eventpipev1.BlockerSecretNotFound},
	}
	for _, tt := range tests {
		kind, cause, _, _, ok := ClassifyBlocker(tt.reason, tt.msg)
		want := eventpipev1.BlockerKindUnschedulable
		if tt.reason == "failedMount" {
			want = eventpipev1.BlockerKindVolume
		}
		if !ok || kind != want || cause != tt.cause {
			t.Errorf("%s %q: %s/%s (ok=%v), want %s/%s", tt.reason, tt.msg, kind, cause, ok, want, tt.cause)
		}
	}
}

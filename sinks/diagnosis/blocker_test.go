package diagnosis

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	eventpipev1 "github.com/eventpipe/eventpipe/api/eventpipe/v1"
	"github.com/eventpipe/eventpipe/enrich"
)

// The other blockers, as the scheduler, the PV controller, the kubelet and
// the sandbox controller write them (wording from the blocker corpus in
// enrich/testdata/blockers), enriched by the real enricher.

// objEvent is one core/v1 Event about any object of a sandbox.
func (f *fixture) objEvent(s sandbox, ref enrich.ObjectRef, typ, reason, msg string, count int32, component, instance string) *eventpipev1.Occurrence {
	f.t.Helper()
	f.seq++
	f.now = f.now.Add(time.Second)
	ref.Namespace = s.ns
	ev := &enrich.Event{APIVersion: "v1", Namespace: s.ns, Name: fmt.Sprintf("%s.%x", ref.Name, len(reason)*7919+len(msg)),
		UID: fmt.Sprintf("ev-%s-%s-%d", ref.Name, reason, len(msg)), ResourceVersion: fmt.Sprint(f.seq),
		Involved: ref, Type: typ, Reason: reason, Message: msg, Count: count,
		FirstTimestamp: f.now.Add(-time.Duration(count) * 10 * time.Second), LastTimestamp: f.now,
		ReportingComponent: component, ReportingInstance: instance}
	r := f.en.Enrich(ev, f.now)
	if r.Missing || r.Occurrence.GetSandbox().GetId() != s.id {
		f.t.Fatalf("fixture event %s %s: attributed to %q (missing %v), want %s", ref.Name, reason, r.Occurrence.GetSandbox().GetId(), r.Missing, s.id)
	}
	return r.Occurrence
}

func (s sandbox) podRef(supervisor bool) enrich.ObjectRef {
	if supervisor {
		return enrich.ObjectRef{Kind: "Pod", APIVersion: "v1", Name: s.supervisorPod(), UID: s.supervisorID}
	}
	return enrich.ObjectRef{Kind: "Pod", APIVersion: "v1", Name: s.name, UID: s.podUID}
}

func (f *fixture) scheduler(s sandbox, supervisor bool, reason, msg string, count int32) *eventpipev1.Occurrence {
	return f.objEvent(s, s.podRef(supervisor), typeOf(reason), reason, msg, count, "default-scheduler", "")
}

func (f *fixture) scheduled(s sandbox, supervisor bool) *eventpipev1.Occurrence {
	ref := s.podRef(supervisor)
	return f.scheduler(s, supervisor, "Scheduled", fmt.Sprintf("Successfully assigned %s/%s to %s", s.ns, ref.Name, nodeName), 1)
}

func (f *fixture) claim(s sandbox, reason, msg string, count int32) *eventpipev1.Occurrence {
	ref := enrich.ObjectRef{Kind: "PersistentVolumeClaim", APIVersion: "v1", Name: s.pvc(), UID: "v" + s.podUID[1:]}
	return f.objEvent(s, ref, typeOf(reason), reason, msg, count, "persistentvolume-controller", "")
}

func (f *fixture) controller(s sandbox, reason, msg string, count int32) *eventpipev1.Occurrence {
	ref := enrich.ObjectRef{Kind: "Sandbox", APIVersion: "agents.x-k8s.io/v1beta1", Name: s.name, UID: s.crUID}
	return f.objEvent(s, ref, typeOf(reason), reason, msg, count, "sandbox-controller", "")
}

// readyCondition is the agent's sandbox condition occurrence for the
// Sandbox's Ready condition as the Agent Sandbox controller writes it (no
// Event says a refusal).
func (f *fixture) readyCondition(s sandbox, status, reason, msg string) *eventpipev1.Occurrence {
	f.t.Helper()
	f.seq++
	f.now = f.now.Add(time.Second)
	cr := *f.lk.sandboxes[s.ns+"/"+s.name]
	cr.ResourceVersion = fmt.Sprint(f.seq)
	cr.Conditions = []enrich.Condition{{Type: "Ready", Status: status, Reason: reason, Message: msg}}
	o := f.en.DiagnoseSandbox(&cr, f.now)
	if o.GetSandbox().GetId() != s.id {
		f.t.Fatalf("condition of %s: attributed to %q", s.name, o.GetSandbox().GetId())
	}
	return o
}

func typeOf(reason string) string {
	switch reason {
	case "Scheduled", "ProvisioningSucceeded", "PodCreated", "SuccessfulCreate", "Pulling", "Pulled", "Created", "Started", "SuccessfulAttachVolume":
		return "Normal"
	}
	return "Warning"
}

// crashStatus is the pod status the agent diagnoses for a crash-looping
// agent container whose last run ended with reason and exit code.
func (f *fixture) crashStatus(s sandbox, restarts int32, reason string, exit int32) []*eventpipev1.Occurrence {
	f.now = f.now.Add(time.Second)
	p := *f.lk.pods[s.ns+"/"+s.name]
	p.ResourceVersion = fmt.Sprint(1000 + f.seq)
	f.seq++
	p.Phase = "Running"
	p.Containers = append([]enrich.Container(nil), p.Containers...)
	p.Containers[2].WaitingReason = "CrashLoopBackOff"
	p.Containers[2].WaitingMessage = fmt.Sprintf("back-off %ds restarting failed container=agent pod=%s_%s(%s)", 10<<restarts, s.name, s.ns, s.podUID)
	p.Containers[2].TerminatedReason, p.Containers[2].TerminatedExitCode, p.Containers[2].RestartCount = reason, exit, restarts
	os := f.en.DiagnosePod(&p, f.now)
	if len(os) != 1 || os[0].GetBlocker() == nil {
		f.t.Fatalf("crash status: diagnosed %v", os)
	}
	return os
}

// crashRound: the kubelet restarts the agent container, it dies, back-off.
func (f *fixture) crashRound(s sandbox, n int32, reason string, exit int32) []*eventpipev1.Occurrence {
	out := []*eventpipev1.Occurrence{
		f.kubeletEvent(s, false, "agent", "Normal", "Pulled", fmt.Sprintf("Container image %q already present on machine", s.image), n),
		f.kubeletEvent(s, false, "agent", "Normal", "Created", "Created container: agent", n),
		f.kubeletEvent(s, false, "agent", "Normal", "Started", "Started container agent", n),
		f.kubeletEvent(s, false, "agent", "Warning", "BackOff",
			fmt.Sprintf("Back-off restarting failed container agent in pod %s_%s(%s)", s.name, s.ns, s.podUID), n),
	}
	return append(out, f.crashStatus(s, n, reason, exit)...)
}

func one(o *eventpipev1.Occurrence) []*eventpipev1.Occurrence { return []*eventpipev1.Occurrence{o} }

func TestFoldOtherBlockers(t *testing.T) {
	const (
		unsched  = "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 2 Insufficient memory. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
		noClass  = `storageclass.storage.k8s.io "fast" not found`
		mountMsg = `MountVolume.SetUp failed for volume "proxy-auth" : secret "proxy-auth" not found`
		quotaMsg = `Error creating: pods "%s" is forbidden: exceeded quota: compute, requested: requests.memory=8Gi, used: requests.memory=6Gi, limited: requests.memory=12Gi`
	)
	type step func(fx *fixture, s sandbox) []*eventpipev1.Occurrence
	for _, tc := range []struct {
		name string
		open step
		// want: the blocker's fields that are not times, counts or ids.
		want      Blocker
		wantExit  int32 // -1: no exit code
		stillOpen step  // events that must not end it
		end       step  // the event that ends it
		settle    bool  // the end needs the container to stay up
	}{{
		name: "unschedulable",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return []*eventpipev1.Occurrence{fx.scheduler(s, false, "FailedScheduling", unsched, 1), fx.scheduler(s, false, "FailedScheduling", unsched, 4)}
		},
		want: Blocker{Kind: eventpipev1.BlockerKindUnschedulable, Cause: eventpipev1.BlockerInsufficientResources, Pod: "unschedulable",
			Object: "Pod/unschedulable", Role: eventpipev1.RoleWorkload},
		wantExit:  -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.scheduled(s, true)) },
		end:       func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.scheduled(s, false)) },
	}, {
		name: "pvc-no-class",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.claim(s, "ProvisioningFailed", noClass, 3))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerStorageClassNotFound,
			Involved: "PersistentVolumeClaim/workspace-pvc-no-class", Object: "StorageClass/fast", Role: eventpipev1.RoleVolume},
		wantExit:  -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.scheduled(s, true)) },
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.claim(s, "ProvisioningSucceeded", "Successfully provisioned volume pvc-3b1f1c2e-8a0e-4c7e-9d0a-1f2b3c4d5e6f", 1))
		},
	}, {
		name: "pvc-bound-pod-scheduled",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.claim(s, "FailedBinding", "no persistent volumes available for this claim and no storage class is set", 2))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerNoStorageClass,
			Involved: "PersistentVolumeClaim/workspace-pvc-bound-pod-scheduled", Object: "PersistentVolumeClaim/workspace-pvc-bound-pod-scheduled", Role: eventpipev1.RoleVolume},
		wantExit: -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return fx.start(s, true, "supervisor", s.supervisorImage)
		},
		// The scheduler binds the workload pod only once its claim is bound.
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.scheduled(s, false)) },
	}, {
		name: "secret-missing",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.objEvent(s, s.podRef(false), "Warning", "FailedMount", mountMsg, 5, "kubelet", nodeName))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindVolume, Cause: eventpipev1.BlockerSecretNotFound, Pod: "secret-missing",
			Object: "Secret/proxy-auth", Node: nodeName, Role: eventpipev1.RoleWorkload},
		wantExit: -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return fx.start(s, true, "supervisor", s.supervisorImage)
		},
		// The kubelet pulls the first container once the volumes are mounted.
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.kubeletEvent(s, false, "openshell-sandbox-bootstrap", "Normal", "Pulling", fmt.Sprintf("Pulling image %q", s.supervisorImage), 1))
		},
	}, {
		name: "quota",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.controller(s, "FailedCreate", fmt.Sprintf(quotaMsg, s.name), 2))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerQuotaExceeded,
			Involved: "Sandbox/quota", Object: "ResourceQuota/compute", Role: eventpipev1.RoleSandbox},
		wantExit: -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return append(one(fx.scheduled(s, true)), fx.start(s, true, "supervisor", s.supervisorImage)...)
		},
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.controller(s, "PodCreated", "Created Pod "+s.name, 1))
		},
	}, {
		name: "quota-pod-scheduled",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.controller(s, "FailedCreate", fmt.Sprintf(quotaMsg, s.name), 1))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerQuotaExceeded,
			Involved: "Sandbox/quota-pod-scheduled", Object: "ResourceQuota/compute", Role: eventpipev1.RoleSandbox},
		wantExit:  -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.scheduled(s, true)) },
		// A controller that says nothing on success: its pod got scheduled.
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.scheduled(s, false)) },
	}, {
		// The Agent Sandbox controller writes no Event on a refusal: the
		// agent reads its Ready condition, and its clearing ends it.
		name: "quota-ready-condition",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.readyCondition(s, "False", "ReconcilerError", "Error seen: "+strings.TrimPrefix(fmt.Sprintf(quotaMsg, s.name), "Error creating: ")))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindCreateRefused, Cause: eventpipev1.BlockerQuotaExceeded,
			Involved: "Sandbox/quota-ready-condition", Object: "ResourceQuota/compute", Role: eventpipev1.RoleSandbox},
		wantExit: -1,
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return append(one(fx.scheduled(s, true)), fx.start(s, true, "supervisor", s.supervisorImage)...)
		},
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.readyCondition(s, "False", "DependenciesNotReady", "Pod exists with phase: Pending"))
		},
	}, {
		// A readiness probe that passes again writes no Event: the agent's
		// container readiness occurrence ends it.
		name: "readiness-probe",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.kubeletEvent(s, false, "agent", "Warning", "Unhealthy", readinessFailed, 3))
		},
		want: Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerReadinessProbe, Pod: "readiness-probe",
			Container: "agent", Object: "Pod/readiness-probe", Role: eventpipev1.RoleWorkload, Node: nodeName},
		wantExit: -1,
		// Another container of the pod ready, the supervisor pod's start.
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return append(one(fx.containerReady(s, "workspace-init")), fx.start(s, true, "supervisor", s.supervisorImage)...)
		},
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return one(fx.containerReady(s, "agent")) },
	}, {
		name: "oom-crash-loop",
		open: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return append(fx.crashRound(s, 1, "OOMKilled", 137), fx.crashRound(s, 2, "OOMKilled", 137)...)
		},
		want: Blocker{Kind: eventpipev1.BlockerKindContainer, Cause: eventpipev1.BlockerOOMKilled, Pod: "oom-crash-loop",
			Container: "agent", Object: "Pod/oom-crash-loop", Role: eventpipev1.RoleWorkload, Node: nodeName},
		wantExit: 137,
		// Started again, then dies again: a Started alone ends nothing.
		stillOpen: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence { return fx.crashRound(s, 3, "OOMKilled", 137) },
		end: func(fx *fixture, s sandbox) []*eventpipev1.Occurrence {
			return one(fx.kubeletEvent(s, false, "agent", "Normal", "Started", "Started container agent", 4))
		},
		settle: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(0x40+len(tc.name), tc.name, workloadImage, supervisorGood)
			fx := newFixture(t, s)
			f := NewFolder()
			f.Now = func() time.Time { return fx.now }
			fd := &feed{f: f}
			opened := tc.open(fx, s)
			fd.add(opened)
			var fix string
			for _, o := range opened {
				if b := o.GetBlocker(); b != nil {
					fix = b.GetFix()
				}
			}
			d := mustSandbox(t, f, s.id)
			if d.State != StateBlocked || len(d.Blockers) != 1 {
				t.Fatalf("after open: state %s blockers %+v", d.State, d.Blockers)
			}
			b := d.Blockers[0]
			got := b
			got.Namespace, got.Disposition, got.Attempts, got.Since, got.LastSeen, got.Detail, got.Remedy, got.EventID, got.Cursor, got.ExitCode =
				"", "", 0, time.Time{}, time.Time{}, "", "", "", 0, nil
			if got.DecidedBy != eventpipev1.DecidedByTextRule || got.Confidence == "" {
				t.Errorf("decided_by %q confidence %q: the occurrence's decision is not carried", got.DecidedBy, got.Confidence)
			}
			got.DecidedBy, got.Confidence = "", ""
			if got != tc.want {
				t.Errorf("blocker\n got %+v\nwant %+v", got, tc.want)
			}
			if fix == "" || b.Remedy != fix {
				t.Errorf("remedy %q, want the occurrence's blocker.fix %q", b.Remedy, fix)
			}
			if b.Namespace != s.ns || b.Attempts < 1 || b.Since.IsZero() || b.LastSeen.Before(b.Since) || b.EventID == "" || b.Detail == "" ||
				(b.Disposition != eventpipev1.DispositionRetrying && b.Disposition != eventpipev1.DispositionPersistent) {
				t.Errorf("namespace/attempts/since/disposition/detail not filled: %+v", b)
			}
			switch {
			case tc.wantExit < 0 && b.ExitCode != nil:
				t.Errorf("exit code %d, want none", *b.ExitCode)
			case tc.wantExit >= 0 && (b.ExitCode == nil || *b.ExitCode != tc.wantExit):
				t.Errorf("exit code %v, want %d", b.ExitCode, tc.wantExit)
			}
			var out bytes.Buffer
			if err := WriteText(&out, d, fx.now); err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{"BLOCKED by 1 blocker:", "  " + tc.want.Kind + ": " + tc.want.Cause + " (" + tc.want.Object + ")", "fix: " + fix} {
				if !strings.Contains(out.String(), w) {
					t.Errorf("text lacks %q:\n%s", w, out.String())
				}
			}
			if tc.wantExit >= 0 && !strings.Contains(out.String(), fmt.Sprintf("last exit code %d", tc.wantExit)) {
				t.Errorf("text lacks the exit code:\n%s", out.String())
			}

			fd.add(tc.stillOpen(fx, s))
			if tc.settle {
				fx.now = fx.now.Add(2 * DefaultCrashSettle)
			}
			if d := mustSandbox(t, f, s.id); d.State != StateBlocked || len(d.Blockers) != 1 || d.Blockers[0].Kind != tc.want.Kind {
				t.Fatalf("ended by events that do not end it: state %s blockers %+v", d.State, d.Blockers)
			}
			// An end event older than the blocker's last sighting ends nothing.
			stale := tc.end(fx, s)
			for _, o := range stale {
				o.OccurredAt.Seconds -= 3600
			}
			fd.add(stale)
			if tc.settle {
				fx.now = fx.now.Add(2 * DefaultCrashSettle)
			}
			if d := mustSandbox(t, f, s.id); d.State != StateBlocked {
				t.Fatalf("a stale %s ended it", stale[0].GetReason())
			}
			fd.add(tc.end(fx, s))
			if tc.settle {
				if d := mustSandbox(t, f, s.id); d.State != StateBlocked {
					t.Fatalf("a crash loop ended at Started, before the container stayed up")
				}
				fx.now = fx.now.Add(DefaultCrashSettle)
			}
			if d := mustSandbox(t, f, s.id); d.State != StateClear || len(d.Blockers) != 0 {
				t.Errorf("after %s: state %s blockers %+v", tc.end(fx, s)[0].GetReason(), d.State, d.Blockers)
			}
		})
	}
}

// TestFoldImageAndOtherBlockers: a sandbox with an image blocker and
// another shows both, supervisor image first, then by stage (creation,
// scheduling, volumes, image pulls, containers) whatever their age.
func TestFoldImageAndOtherBlockers(t *testing.T) {
	a := newSandbox(0x60, "sup-and-unsched", workloadImage, supervisorBad)
	b := newSandbox(0x61, "crash-and-mount", imageMissing, supervisorGood)
	fx := newFixture(t, a, b)
	f := NewFolder()
	f.Now = func() time.Time { return fx.now }
	fd := &feed{f: f}
	fd.add(one(fx.scheduler(a, false, "FailedScheduling", "0/1 nodes are available: 1 Insufficient memory.", 1)))
	fd.add(fx.pullFailure(a, true, "supervisor", supervisorBad, 1))
	// b: the agent container crash-loops first; later a secret of the
	// supervisor pod goes missing and the workspace-init image goes.
	fd.add(fx.crashRound(b, 1, "Error", 1))
	fd.add(fx.pullFailure(b, false, "workspace-init", imageMissing, 1))
	fd.add(one(fx.objEvent(b, b.podRef(true), "Warning", "FailedMount",
		`MountVolume.SetUp failed for volume "tls" : secret "gateway-tls" not found`, 1, "kubelet", nodeName)))

	kinds := func(d Diagnosis) string {
		var ks []string
		for _, bl := range d.Blockers {
			ks = append(ks, bl.Kind+"/"+bl.Cause)
		}
		return strings.Join(ks, " ")
	}
	if got, want := kinds(mustSandbox(t, f, a.id)), "image_pull/not_found unschedulable/insufficient_resources"; got != want {
		t.Errorf("%s: %s, want %s", a.name, got, want)
	}
	db := mustSandbox(t, f, b.id)
	if got, want := kinds(db), "volume/secret_not_found image_pull/not_found container/exit_error"; got != want {
		t.Errorf("%s: %s, want %s", b.name, got, want)
	}
	// A pod whose claim is unbound is unschedulable because of it: the
	// claim comes first, though it was seen last.
	c := newSandbox(0x62, "claim-first", workloadImage, supervisorGood)
	fx2 := newFixture(t, c)
	fd2 := &feed{f: NewFolder()}
	fd2.add(one(fx2.scheduler(c, false, "FailedScheduling", "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.", 1)))
	fd2.add(one(fx2.claim(c, "FailedBinding", "no persistent volumes available for this claim and no storage class is set", 1)))
	if got, want := kinds(mustSandbox(t, fd2.f, c.id)), "volume/no_storage_class unschedulable/unbound_pvc"; got != want {
		t.Errorf("%s: %s, want %s", c.name, got, want)
	}
	if groups := Supervisor(f.Sandboxes()); len(groups) != 1 || len(groups[0].Sandboxes) != 1 || groups[0].Sandboxes[0].ID != a.id {
		t.Errorf("supervisor groups take other blockers: %+v", groups)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, []Diagnosis{db}, fx.now); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"BLOCKER", "WHAT", "volume", "Secret/gateway-tls", "workload", imageMissing, "container", "container agent exit 1",
		"fix crash-and-mount (volume): ", "fix crash-and-mount (workload image): ", "fix crash-and-mount (container, container agent): "} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, out.String())
		}
	}
	// The pull of workspace-init succeeding ends only the image blocker.
	fd.add(fx.start(b, false, "workspace-init", imageMissing)[:1])
	if got, want := kinds(mustSandbox(t, f, b.id)), "volume/secret_not_found container/exit_error"; got != want {
		t.Errorf("after Pulled: %s, want %s", got, want)
	}
}

const (
	readinessFailed = "Readiness probe failed: cat: can't open '/tmp/ready': No such file or directory"
	startupFailed   = "Startup probe failed: cat: can't open '/tmp/started': No such file or directory"
	livenessFailed  = "Liveness probe failed: HTTP probe failed with statuscode: 503"
)

// containerReady is the agent's container readiness occurrence for
// container of s's workload pod (a readiness or startup probe, ready now),
// as the agent writes it at this moment.
func (f *fixture) containerReady(s sandbox, container string) *eventpipev1.Occurrence {
	f.t.Helper()
	f.seq++
	p := *f.lk.pods[s.ns+"/"+s.name]
	p.ResourceVersion = fmt.Sprint(2000 + f.seq)
	p.Containers = append([]enrich.Container(nil), p.Containers...)
	for i := range p.Containers {
		if p.Containers[i].Name == container {
			p.Containers[i].Probed, p.Containers[i].Ready, p.Containers[i].Started = true, true, true
		}
	}
	os := f.en.ContainersReady(nil, &p, f.now)
	if len(os) != 1 || os[0].GetSandbox().GetId() != s.id || !eventpipev1.IsContainerReady(os[0]) {
		f.t.Fatalf("container readiness of %s: %v", container, os)
	}
	return os[0]
}

// TestFoldProbeEnds: when a probe blocker ends. The agent's container
// readiness occurrence ends the readiness and startup blockers of that
// container, not older than their last failure to the second (in a tie
// the end wins, and a report of that failure read later does not open it
// again); a failure after it opens it again. A liveness blocker is not
// ended by it (a ready container can still fail its liveness probe): the
// Started of the restart it causes ends it, as before. A Kubernetes Event
// that happens to say ContainerReady ends nothing.
func TestFoldProbeEnds(t *testing.T) {
	s := newSandbox(0x70, "probes", workloadImage, supervisorGood)
	fx := newFixture(t, s)
	f := NewFolder()
	f.Now = func() time.Time { return fx.now }
	fd := &feed{f: f}
	causes := func() []string {
		var out []string
		for _, b := range mustSandbox(t, f, s.id).Blockers {
			out = append(out, b.Cause)
		}
		return out
	}
	expect := func(when string, want ...string) {
		t.Helper()
		if got := causes(); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("%s: blockers %q, want %q", when, got, want)
		}
	}

	failed := fx.kubeletEvent(s, false, "agent", "Warning", "Unhealthy", readinessFailed, 3)
	fd.add(one(failed))
	expect("after three failures", eventpipev1.BlockerReadinessProbe)
	// Ready in the second of the last failure: the end wins the tie.
	fd.add(one(fx.containerReady(s, "agent")))
	expect("ready in the second of the last failure")
	// The failure's report read again (a relisting, a late update of the
	// same second) does not open it again.
	fd.add(one(failed))
	late := fx.kubeletEvent(s, false, "agent", "Warning", "Unhealthy", readinessFailed, 3)
	late.GetBlocker().LastSeen = failed.GetBlocker().GetLastSeen()
	fd.add(one(late))
	expect("a failure not later than the end")
	// A failure after it: blocked again, until the next readiness.
	fd.add(one(fx.kubeletEvent(s, false, "agent", "Warning", "Unhealthy", readinessFailed, 4)))
	expect("a later failure", eventpipev1.BlockerReadinessProbe)
	// Another writer's Event with the reason is no end, nor is another
	// container's readiness.
	fd.add(one(fx.kubeletEvent(s, false, "agent", "Normal", eventpipev1.ReasonContainerReady, "container agent is ready", 1)))
	fx.now = fx.now.Add(time.Second)
	fd.add(one(fx.containerReady(s, "workspace-init")))
	expect("a kubelet Event named ContainerReady, another container ready", eventpipev1.BlockerReadinessProbe)
	fd.add(one(fx.containerReady(s, "agent")))
	expect("ready again")

	// Startup: the same end (a ready container passed its startup probe).
	fd.add(one(fx.kubeletEvent(s, false, "agent", "Warning", "Unhealthy", startupFailed, 3)))
	expect("startup failures", eventpipev1.BlockerStartupProbe)
	fx.now = fx.now.Add(time.Second)
	fd.add(one(fx.containerReady(s, "agent")))
	expect("started and ready")

	// Liveness: readiness ends nothing; the restart's Started does.
	fd.add(one(fx.kubeletEvent(s, false, "agent", "Warning", "Unhealthy", livenessFailed, 3)))
	expect("liveness failures", eventpipev1.BlockerLivenessProbe)
	fx.now = fx.now.Add(time.Second)
	fd.add(one(fx.containerReady(s, "agent")))
	expect("ready, liveness still failing", eventpipev1.BlockerLivenessProbe)
	fd.add(one(fx.kubeletEvent(s, false, "agent", "Normal", "Killing", "Container agent failed liveness probe, will be restarted", 1)))
	fd.add(one(fx.kubeletEvent(s, false, "agent", "Normal", "Started", "Started container agent", 2)))
	expect("restarted")
}
